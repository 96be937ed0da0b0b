// MetricsServer: the HTTP endpoint of a prl process for Prometheus and for a fleet manager's
// probes (Kubernetes' kubelet, docs/deploy.md):
//
//   GET|HEAD /metrics  the registry in text exposition format 0.0.4 (prometheus-cpp's
//                      TextSerializer)
//   GET|HEAD /healthz  200 while the process serves (liveness)
//   GET|HEAD /readyz   200 once the role's readiness check passes, else 503 with the reason
//                      (readiness: the coordinator has replayed its log and serves, the learner
//                      has loaded its checkpoint and published, an actor has registered and
//                      holds weights)
//
// HTTP is Boost.Beast on one Asio thread, one request per connection (`Connection: close`). Not
// prometheus-cpp's civetweb Exposer: Debian's civetweb runs handlers on 100 KB thread stacks,
// and glibc carves every library's static TLS out of each thread's stack (libopenblas alone
// takes 61 KB), so in any prl process that links the kernels a scrape overflowed the stack.
//
// Bounds, so that a slow or hostile client cannot take the endpoint away from the scraper and
// the kubelet: a connection has `request_timeout_ms` from its accept to deliver its request and
// take the response, then it is closed (a slowloris is cut off; connections are served
// concurrently, so it never delays another); at most `max_connections` are open at once, and
// one more is answered `503` and closed at once; requests are GET or HEAD with headers of at
// most 16 KiB and no body.
//
// One registry per process holds every metric of that process: the process creates a
// std::shared_ptr<prometheus::Registry>, builds the catalog on it (metrics/prl_metrics.h), and
// starts a MetricsServer on it when metrics are enabled. Metrics work the same without a server
// (updates are cheap and nobody reads them).
//
// Thread-safety: metrics may be updated from any thread while the endpoint serves scrapes;
// SetReadiness may be called from any thread. Start and destruction must not race.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace prometheus {
class Registry;
}  // namespace prometheus

namespace prl::metrics {

struct MetricsServerOptions {
  // "host:port" (an IPv4 address or a host name) or "port" (loopback, like every prl
  // listener; "0.0.0.0:port" serves all interfaces). Port 0 binds any free port, which port()
  // reports: several prl processes share a node, so only deployments that give each process
  // its own scrape port should fix one.
  std::string address = "127.0.0.1:0";
  // From accept to the last byte of the response (a Prometheus scrape takes milliseconds).
  int request_timeout_ms = 5000;
  // Connections open at once; more are refused with 503. Prometheus and the kubelet open one
  // each at a time, so 64 leaves room for several scrapers and probes.
  int max_connections = 64;
};

// A role's readiness: OK when ready, otherwise a status whose message says what it waits for
// ("not registered with the coordinator yet"). Runs on the server's thread: keep it cheap.
using ReadinessCheck = std::function<absl::Status()>;

class MetricsServer {
 public:
  // Serves `registry` at http://<address>/metrics (and the probes). A port already in use is
  // Unavailable and an address that is not host:port is InvalidArgument; both messages carry
  // the server's reason.
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(
      const MetricsServerOptions& options, std::shared_ptr<prometheus::Registry> registry);

  // Stops serving and closes every connection before it returns; the registry lives on with
  // its other owners.
  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  int port() const;  // the port actually bound (never 0)
  prometheus::Registry& registry() const;

  // /readyz answers with `check` from now on. Until the first call, and after a call with a
  // null check, the process is not ready ("starting"). A role clears its check before the
  // objects the check reads are destroyed.
  void SetReadiness(ReadinessCheck check);

  struct Impl;  // the Asio side (metrics_server.cc)

 private:
  explicit MetricsServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace prl::metrics
