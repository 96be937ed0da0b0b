#include "roles/role_metrics.h"

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"

namespace prl::roles {

std::string RoleMetrics::Describe() const {
  return server == nullptr ? std::string()
                           : absl::StrCat(" (metrics on port ", server->port(), ")");
}

void RoleMetrics::SetReadiness(metrics::ReadinessCheck check) const {
  if (server != nullptr) server->SetReadiness(std::move(check));
}

absl::StatusOr<std::unique_ptr<RoleMetrics>> StartRoleMetrics(
    const config::MetricsSection& config) {
  auto m = std::make_unique<RoleMetrics>();
  if (!config.enabled) return m;
  metrics::MetricsServerOptions options;
  options.address = config.listen;
  PRL_ASSIGN_OR_RETURN(m->server, metrics::MetricsServer::Start(options, m->registry));
  return m;
}

void ExportDeadLetters(const QuarantineCounts& counts, metrics::QuarantineMetrics& metrics) {
  for (int i = 0; i < kNumDeadLetterReasons; ++i) {
    metrics::AdvanceCounterTo(
        metrics.DeadLettered(DeadLetterReasonName(static_cast<DeadLetterReason>(i))),
        static_cast<double>(counts.by_reason[static_cast<size_t>(i)]));
  }
}

}  // namespace prl::roles
