// MetricsServer: the /metrics HTTP endpoint of a prl process. Prometheus scrapes it (text
// exposition format 0.0.4, serialised by prometheus-cpp's TextSerializer).
//
// The HTTP side is a small server of our own on one thread (GET and HEAD of /metrics, one
// request per connection, `Connection: close`), not prometheus-cpp's civetweb Exposer:
// Debian's civetweb runs handlers on 100 KB thread stacks, and glibc carves every library's
// static TLS out of each thread's stack — libopenblas alone takes 61 KB, so in any prl process
// that links the kernels a scrape overflowed the stack and crashed the process.
//
// One registry per process holds every metric of that process: the process creates a
// std::shared_ptr<prometheus::Registry>, builds the catalog on it (metrics/prl_metrics.h), and
// starts a MetricsServer on it when metrics are enabled. Metrics work the same without a server
// (updates are cheap and nobody reads them).
//
// Thread-safety: metrics may be updated from any thread while the endpoint serves scrapes.
// Start and destruction must not race with each other.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"

namespace prometheus {
class Registry;
}  // namespace prometheus

namespace prl::metrics {

struct MetricsServerOptions {
  // "host:port" (an IPv4 address or a host name; loopback by default) or "port" (all
  // interfaces). Port 0 binds any
  // free port, which port() reports: several prl processes share a node, so only deployments
  // that give each process its own scrape port should fix one.
  std::string address = "127.0.0.1:0";
  // A client that has not sent its request within this is disconnected (so that a stuck
  // client cannot hold up the next scrape).
  int request_timeout_ms = 5000;
};

class MetricsServer {
 public:
  // Serves `registry` at http://<address>/metrics. A port already in use is Unavailable and an
  // address that is not host:port is InvalidArgument; both messages carry the server's reason.
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(
      const MetricsServerOptions& options, std::shared_ptr<prometheus::Registry> registry);

  // Stops serving (within ~0.2 s); the registry lives on with its other owners.
  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  int port() const { return port_; }  // the port actually bound (never 0)
  prometheus::Registry& registry() const { return *registry_; }

 private:
  MetricsServer(std::shared_ptr<prometheus::Registry> registry, int listen_fd, int port,
                int request_timeout_ms);
  void Serve();
  void Answer(int fd);

  std::shared_ptr<prometheus::Registry> registry_;
  int listen_fd_ = -1;
  int port_ = 0;
  int request_timeout_ms_ = 5000;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace prl::metrics
