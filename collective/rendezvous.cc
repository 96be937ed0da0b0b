#include "collective/rendezvous.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <optional>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "core/net_address.h"
#include "core/status_macros.h"

namespace prl::collective {

namespace {

std::optional<std::string> GetEnv(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr) return std::nullopt;
  return std::string(value);
}

absl::StatusOr<std::string> RequiredEnv(const char* name, absl::string_view expected) {
  std::optional<std::string> value = GetEnv(name);
  if (!value.has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat("environment variable ", name, " is not set (expected ", expected, ")"));
  }
  return *value;
}

absl::StatusOr<int> IntEnv(const char* name, absl::string_view expected) {
  PRL_ASSIGN_OR_RETURN(const std::string text, RequiredEnv(name, expected));
  int value = 0;
  if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(text), &value)) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, "='", text, "' is not an integer (expected ", expected, ")"));
  }
  return value;
}

}  // namespace

absl::StatusOr<RendezvousConfig> RendezvousFromEnv() {
  RendezvousConfig config;
  PRL_ASSIGN_OR_RETURN(config.rank, IntEnv("RANK", "this process's rank, 0 <= RANK < WORLD_SIZE"));
  PRL_ASSIGN_OR_RETURN(config.world_size,
                       IntEnv("WORLD_SIZE", "the number of ranks in the group, >= 1"));
  PRL_ASSIGN_OR_RETURN(config.master_addr,
                       RequiredEnv("MASTER_ADDR", "the host name or IP address of rank 0"));
  PRL_ASSIGN_OR_RETURN(
      config.master_port,
      IntEnv("MASTER_PORT", "the TCP port rank 0 serves the rendezvous store on, 1..65535"));
  PRL_RETURN_IF_ERROR(ValidateRendezvous(config));
  return config;
}

absl::Status ValidateGroup(const RendezvousConfig& config) {
  if (config.world_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("WORLD_SIZE=", config.world_size, ": expected a number of ranks >= 1"));
  }
  if (config.rank < 0 || config.rank >= config.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("RANK=", config.rank, " is out of range for WORLD_SIZE=", config.world_size,
                     " (expected 0 <= RANK < WORLD_SIZE)"));
  }
  if (config.timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat("rendezvous timeout ",
                                                   absl::FormatDuration(config.timeout),
                                                   ": expected a positive duration"));
  }
  if (config.group_name.empty()) {
    return absl::InvalidArgumentError("rendezvous group_name is empty: expected a key prefix");
  }
  return absl::OkStatus();
}

absl::Status ValidateRendezvous(const RendezvousConfig& config) {
  PRL_RETURN_IF_ERROR(ValidateGroup(config));
  if (config.master_addr.empty()) {
    return absl::InvalidArgumentError(
        "MASTER_ADDR is empty: expected the host name or IP address of rank 0");
  }
  if (config.file_store_dir.empty() && (config.master_port < 1 || config.master_port > 65535)) {
    return absl::InvalidArgumentError(
        absl::StrCat("MASTER_PORT=", config.master_port, ": expected a TCP port in 1..65535"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> LocalAddressFacing(const std::string& master_addr) {
  if (IsLoopbackHost(master_addr)) return std::string("127.0.0.1");
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  const int rv = getaddrinfo(master_addr.c_str(), "9", &hints, &found);
  if (rv != 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot resolve MASTER_ADDR=", master_addr, ": ", gai_strerror(rv)));
  }
  std::string local;
  for (addrinfo* a = found; a != nullptr && local.empty(); a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
    if (fd < 0) continue;
    sockaddr_storage self{};
    socklen_t len = sizeof(self);
    if (connect(fd, a->ai_addr, a->ai_addrlen) == 0 &&
        getsockname(fd, reinterpret_cast<sockaddr*>(&self), &len) == 0) {
      char text[INET6_ADDRSTRLEN] = {};
      const void* ip =
          self.ss_family == AF_INET
              ? static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(&self)->sin_addr)
              : static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(&self)->sin6_addr);
      if (inet_ntop(self.ss_family, ip, text, sizeof(text)) != nullptr) local = text;
    }
    close(fd);
  }
  freeaddrinfo(found);
  if (local.empty()) {
    return absl::UnavailableError(
        absl::StrCat("no network interface of this host routes to MASTER_ADDR=", master_addr));
  }
  return local;
}

}  // namespace prl::collective
