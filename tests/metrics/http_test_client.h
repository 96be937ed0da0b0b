// A tiny HTTP client for the metrics tests: one request per connection to 127.0.0.1, the way
// Prometheus and the kubelet talk to a prl process's endpoint (metrics/metrics_server.h).
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace prl::metrics {

// A TCP connection to 127.0.0.1:<port> with 10 s send and receive time-outs; -1 on failure.
inline int ConnectLoopback(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  timeval timeout{.tv_sec = 10, .tv_usec = 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof(timeout));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// Sends `request` to 127.0.0.1:<port> and returns the whole response (the server closes).
inline absl::StatusOr<std::string> HttpExchange(int port, const std::string& request) {
  const int fd = ConnectLoopback(port);
  if (fd < 0) return absl::UnavailableError(absl::StrCat("cannot connect to 127.0.0.1:", port));
  if (send(fd, request.data(), request.size(), 0) != static_cast<ssize_t>(request.size())) {
    close(fd);
    return absl::UnavailableError("send() failed");
  }
  std::string response;
  char chunk[4096];
  ssize_t n;
  while ((n = recv(fd, chunk, sizeof(chunk), 0)) > 0) response.append(chunk, n);
  close(fd);
  if (n < 0) return absl::DeadlineExceededError("recv() failed or timed out");
  return response;
}

// GET http://127.0.0.1:<port><path> over HTTP/1.0; returns the body of a 200 response.
inline absl::StatusOr<std::string> HttpGet(int port, const std::string& path) {
  absl::StatusOr<std::string> exchanged =
      HttpExchange(port, absl::StrCat("GET ", path, " HTTP/1.0\r\nHost: localhost\r\n\r\n"));
  if (!exchanged.ok()) return exchanged.status();
  const std::string response = *std::move(exchanged);
  const size_t body = response.find("\r\n\r\n");
  if (body == std::string::npos || !absl::StartsWith(response, "HTTP/1.")) {
    return absl::DataLossError(absl::StrCat("not an HTTP response: ", response));
  }
  const std::string status_line = response.substr(0, response.find("\r\n"));
  if (!absl::StrContains(status_line, " 200 ")) {
    return absl::FailedPreconditionError(absl::StrCat("GET ", path, ": ", status_line));
  }
  return response.substr(body + 4);
}

}  // namespace prl::metrics
