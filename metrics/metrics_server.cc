#include "metrics/metrics_server.h"

#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace prl::metrics {
namespace {

absl::Status BadAddress(const std::string& address, const std::string& reason) {
  return absl::InvalidArgumentError(
      absl::StrCat("cannot serve /metrics on '", address, "': ", reason,
                   ". Expected host:port or port, IPv4 or a host name (port 0 = any free port)"));
}

// Writes all of `data` (a scraper that hung up is not an error worth reporting).
void SendAll(int fd, const std::string& data) {
  size_t sent = 0;
  while (sent < data.size()) {
    const ssize_t n = ::send(fd, data.data() + sent, data.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) {
      if (n < 0 && errno == EINTR) continue;
      return;
    }
    sent += static_cast<size_t>(n);
  }
}

std::string Response(const char* status, const char* content_type, const std::string& body,
                     bool head) {
  return absl::StrCat("HTTP/1.1 ", status, "\r\nContent-Type: ", content_type,
                      "\r\nContent-Length: ", body.size(), "\r\nConnection: close\r\n\r\n",
                      head ? "" : body);
}

}  // namespace

MetricsServer::MetricsServer(std::shared_ptr<prometheus::Registry> registry, int listen_fd,
                             int port, int request_timeout_ms)
    : registry_(std::move(registry)),
      listen_fd_(listen_fd),
      port_(port),
      request_timeout_ms_(request_timeout_ms) {
  thread_ = std::thread([this] { Serve(); });
}

MetricsServer::~MetricsServer() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
  ::close(listen_fd_);
}

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(
    const MetricsServerOptions& options, std::shared_ptr<prometheus::Registry> registry) {
  if (registry == nullptr) {
    return absl::InvalidArgumentError("MetricsServer::Start: registry is null");
  }
  const std::string& address = options.address;
  if (address.empty()) {
    return absl::InvalidArgumentError(
        "metrics address is empty: expected host:port or port (port 0 = any free port)");
  }
  if (options.request_timeout_ms < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "metrics request_timeout_ms must be at least 1, got ", options.request_timeout_ms));
  }
  std::string host = "0.0.0.0", port_text = address;
  const size_t colon = address.rfind(':');
  if (colon != std::string::npos) {
    host = address.substr(0, colon);
    port_text = address.substr(colon + 1);
  }
  int port = 0;
  if (host.empty() || !absl::SimpleAtoi(port_text, &port) || port < 0 || port > 65535) {
    return BadAddress(address, "invalid port spec");
  }
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (const int err = ::getaddrinfo(host.c_str(), nullptr, &hints, &found); err != 0) {
    return BadAddress(address, absl::StrCat("cannot resolve '", host, "': ", gai_strerror(err)));
  }
  sockaddr_in addr = *reinterpret_cast<sockaddr_in*>(found->ai_addr);
  ::freeaddrinfo(found);
  addr.sin_port = htons(static_cast<uint16_t>(port));

  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError(absl::StrCat("socket: ", std::strerror(errno)));
  const int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || ::listen(fd, 16) != 0) {
    const int err = errno;
    ::close(fd);
    return absl::UnavailableError(absl::StrCat(
        "cannot serve /metrics on '", address, "': ", std::strerror(err),
        ". If the port is in use (another prl process or exporter on this node), choose another "
        "metrics port, or port 0 for any free one"));
  }
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  return std::unique_ptr<MetricsServer>(
      new MetricsServer(std::move(registry), fd, ntohs(addr.sin_port), options.request_timeout_ms));
}

void MetricsServer::Serve() {
  while (!stop_) {
    pollfd p{listen_fd_, POLLIN, 0};
    if (::poll(&p, 1, 200) <= 0) continue;
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    Answer(fd);
    ::close(fd);
  }
}

void MetricsServer::Answer(int fd) {
  // The request head: up to the blank line, at most 16 KiB, within the time-out.
  std::string head;
  char buf[4096];
  while (head.find("\r\n\r\n") == std::string::npos && head.size() < 16384) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, request_timeout_ms_) <= 0) return;
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) return;
    head.append(buf, static_cast<size_t>(n));
  }
  const std::vector<std::string> request_line =
      absl::StrSplit(head.substr(0, head.find("\r\n")), ' ', absl::SkipEmpty());
  if (request_line.size() < 2) {
    SendAll(fd, Response("400 Bad Request", "text/plain", "bad request\n", false));
    return;
  }
  const std::string& method = request_line[0];
  const std::string path = request_line[1].substr(0, request_line[1].find('?'));
  const bool head_only = method == "HEAD";
  if (method != "GET" && !head_only) {
    SendAll(fd, Response("405 Method Not Allowed", "text/plain", "only GET and HEAD\n", false));
    return;
  }
  if (path != "/metrics") {
    SendAll(fd, Response("404 Not Found", "text/plain", "not found: the metrics are at /metrics\n",
                         head_only));
    return;
  }
  const std::string body = prometheus::TextSerializer().Serialize(registry_->Collect());
  SendAll(fd, Response("200 OK", "text/plain; version=0.0.4; charset=utf-8", body, head_only));
}

}  // namespace prl::metrics
