// A role's Prometheus endpoint: one registry per process (metrics/prl_metrics.h builds the
// catalog on it) and, when `metrics.enabled`, a /metrics server on `metrics.listen` that also
// answers the probes /healthz and /readyz. A role starts it before its slow start-up (log
// replay, model and checkpoint loading) so that liveness holds meanwhile, and sets its
// readiness check once it can do its work.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "config/run_config.h"
#include "metrics/metrics_server.h"
#include "metrics/prl_metrics.h"
#include "prometheus/registry.h"
#include "replay/quarantine.h"

namespace prl::roles {

struct RoleMetrics {
  std::shared_ptr<prometheus::Registry> registry = std::make_shared<prometheus::Registry>();
  std::unique_ptr<metrics::MetricsServer> server;  // null when metrics are disabled

  // " (metrics on port N)" or "" for log lines.
  std::string Describe() const;
  // /readyz answers with `check` (null: not ready); a no-op when metrics are disabled.
  void SetReadiness(metrics::ReadinessCheck check) const;
};

// Mirrors a checker's dead-letter counts (replay/quarantine.h) into
// prl_replay_groups_dead_lettered_total{reason}.
void ExportDeadLetters(const QuarantineCounts& counts, metrics::QuarantineMetrics& metrics);

// Starts the endpoint when enabled (an address in use is Unavailable naming it).
absl::StatusOr<std::unique_ptr<RoleMetrics>> StartRoleMetrics(const config::MetricsSection& config);

}  // namespace prl::roles
