#include "metrics/metrics_server.h"

#include <CivetServer.h>
#include <prometheus/exposer.h>
#include <prometheus/registry.h>

#include <exception>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace prl::metrics {
namespace {

// civetweb reports why it could not start ("cannot bind to 127.0.0.1:9400: 98 (Address
// already in use)") only through its log callback, on the thread that starts it; the exception
// prometheus-cpp throws says just "possible problem binding to port". While Start runs on a
// thread, this points at the string that collects those lines.
thread_local std::string* startup_log = nullptr;

int CaptureStartupLog(const mg_connection* /*connection*/, const char* message) {
  if (startup_log == nullptr) return 0;  // a request-time message: civetweb's default handling
  if (!startup_log->empty()) startup_log->append("; ");
  startup_log->append(message);
  return 1;
}

}  // namespace

MetricsServer::MetricsServer(std::shared_ptr<prometheus::Registry> registry,
                             std::unique_ptr<prometheus::Exposer> exposer, int port)
    : registry_(std::move(registry)), exposer_(std::move(exposer)), port_(port) {}

MetricsServer::~MetricsServer() = default;

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(
    const MetricsServerOptions& options, std::shared_ptr<prometheus::Registry> registry) {
  if (registry == nullptr) {
    return absl::InvalidArgumentError("MetricsServer::Start: registry is null");
  }
  if (options.address.empty()) {
    return absl::InvalidArgumentError(
        "metrics address is empty: expected host:port or port (port 0 = any free port)");
  }
  if (options.num_threads < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics num_threads must be at least 1, got ", options.num_threads));
  }

  CivetCallbacks callbacks;
  callbacks.log_message = CaptureStartupLog;
  std::string log;
  std::unique_ptr<prometheus::Exposer> exposer;
  std::string failure;
  startup_log = &log;
  try {
    exposer = std::make_unique<prometheus::Exposer>(
        options.address, static_cast<size_t>(options.num_threads), &callbacks);
  } catch (const std::exception& e) {
    failure = e.what();
  }
  startup_log = nullptr;

  if (exposer == nullptr) {
    const std::string reason = log.empty() ? failure : log;
    if (absl::StrContains(log, "invalid port spec")) {
      return absl::InvalidArgumentError(absl::StrCat(
          "cannot serve /metrics on '", options.address, "': ", reason,
          ". Expected host:port or port, IPv4 or a host name (port 0 = any free port)"));
    }
    return absl::UnavailableError(absl::StrCat(
        "cannot serve /metrics on '", options.address, "': ", reason,
        ". If the port is in use (another prl process or exporter on this node), choose another "
        "metrics port, or port 0 for any free one"));
  }

  const std::vector<int> ports = exposer->GetListeningPorts();
  if (ports.empty() || ports.front() <= 0) {
    return absl::InternalError(absl::StrCat("metrics server on '", options.address,
                                            "' started but reports no listening port"));
  }
  exposer->RegisterCollectable(registry);
  return std::unique_ptr<MetricsServer>(
      new MetricsServer(std::move(registry), std::move(exposer), ports.front()));
}

}  // namespace prl::metrics
