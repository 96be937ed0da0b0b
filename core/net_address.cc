#include "core/net_address.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace prl {

namespace {

enum class Literal { kNone, kLoopback, kOther };

// An IPv4 or IPv6 literal (without brackets), and whether it is loopback.
Literal ParseLiteral(absl::string_view host) {
  const std::string text(host);
  in_addr v4;
  if (inet_pton(AF_INET, text.c_str(), &v4) == 1) {
    return (ntohl(v4.s_addr) >> 24) == 127 ? Literal::kLoopback : Literal::kOther;
  }
  in6_addr v6;
  if (inet_pton(AF_INET6, text.c_str(), &v6) == 1) {
    return IN6_IS_ADDR_LOOPBACK(&v6) ? Literal::kLoopback : Literal::kOther;
  }
  return Literal::kNone;
}

}  // namespace

bool IsLoopbackHost(absl::string_view host) {
  if (host == "localhost") return true;
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  return ParseLiteral(host) == Literal::kLoopback;
}

bool IsLoopbackEndpoint(absl::string_view endpoint) {
  if (absl::StartsWith(endpoint, "unix:") || absl::StartsWith(endpoint, "unix-abstract:")) {
    return true;
  }
  if (!absl::ConsumePrefix(&endpoint, "dns:///") && !absl::ConsumePrefix(&endpoint, "ipv4:")) {
    absl::ConsumePrefix(&endpoint, "ipv6:");
  }
  // A bare literal without a port ("::1:80" is one IPv6 address, not ::1 and a port).
  const Literal bare = ParseLiteral(endpoint);
  if (bare != Literal::kNone) return bare == Literal::kLoopback;
  const size_t colon = endpoint.rfind(':');
  if (colon == absl::string_view::npos) return false;
  return IsLoopbackHost(endpoint.substr(0, colon));
}

absl::StatusOr<int> PickFreePort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError(absl::StrCat("socket: ", std::strerror(errno)));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    const int err = errno;
    ::close(fd);
    return absl::InternalError(absl::StrCat("picking a free port: ", std::strerror(err)));
  }
  ::close(fd);
  return static_cast<int>(ntohs(addr.sin_port));
}

bool PortInUse(absl::string_view endpoint) {
  const size_t colon = endpoint.rfind(':');
  if (colon == absl::string_view::npos) return false;
  std::string host(endpoint.substr(0, colon));
  const std::string port(endpoint.substr(colon + 1));
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  if (::getaddrinfo(host.empty() ? nullptr : host.c_str(), port.c_str(), &hints, &found) != 0) {
    return false;
  }
  bool in_use = false;
  for (addrinfo* a = found; a != nullptr && !in_use; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    const int one = 1;  // a port in TIME_WAIT is free to listen on again
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    in_use = ::bind(fd, a->ai_addr, a->ai_addrlen) != 0 && errno == EADDRINUSE;
    ::close(fd);
  }
  ::freeaddrinfo(found);
  return in_use;
}

}  // namespace prl
