// MetricsServer: the /metrics HTTP endpoint of a prl process. Prometheus scrapes it (text
// exposition format 0.0.4); prometheus-cpp's Exposer serves it on civetweb worker threads.
//
// One registry per process holds every metric of that process: the process creates a
// std::shared_ptr<prometheus::Registry>, builds the catalog on it (metrics/prl_metrics.h), and
// starts a MetricsServer on it when metrics are enabled. Metrics work the same without a server
// (updates are cheap and nobody reads them).
//
// Besides the registry's metrics, the endpoint serves prometheus-cpp's own three exposer_*
// metrics (scrapes, bytes transferred, scrape latency); they carry no prl_ prefix because the
// library registers them itself.
//
// Thread-safety: metrics may be updated from any thread while the endpoint serves scrapes.
// Start and destruction must not race with each other.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace prometheus {
class Exposer;
class Registry;
}  // namespace prometheus

namespace prl::metrics {

struct MetricsServerOptions {
  // "host:port" (an IPv4 address or a host name) or "port" (all interfaces). Port 0 binds any
  // free port, which port() reports: several prl processes share a node, so only deployments
  // that give each process its own scrape port should fix one.
  std::string address = "0.0.0.0:0";
  // HTTP worker threads. Prometheus scrapes every few seconds; two threads let a slow scrape
  // (or a second scraper) not queue behind another.
  int num_threads = 2;
};

class MetricsServer {
 public:
  // Serves `registry` at http://<address>/metrics. A port already in use is Unavailable and an
  // address that is not host:port is InvalidArgument; both messages carry the server's reason.
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(
      const MetricsServerOptions& options, std::shared_ptr<prometheus::Registry> registry);

  // Stops serving; the registry lives on with its other owners. Takes up to 2 s: civetweb's
  // listener notices the stop only when its poll period ends.
  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  int port() const { return port_; }  // the port actually bound (never 0)
  prometheus::Registry& registry() const { return *registry_; }

 private:
  MetricsServer(std::shared_ptr<prometheus::Registry> registry,
                std::unique_ptr<prometheus::Exposer> exposer, int port);

  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<prometheus::Exposer> exposer_;  // holds only a weak_ptr to the registry
  int port_ = 0;
};

}  // namespace prl::metrics
