#include "roles/replay_role.h"

#include <cstdio>
#include <thread>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "replay/ingest_server.h"
#include "replay/replay_buffer.h"
#include "roles/role_metrics.h"

namespace prl::roles {

ReplayConfig ReplayConfigFrom(const config::RunConfig& c) {
  ReplayConfig rc;
  rc.capacity_bytes = c.replay.capacity_mb << 20;
  rc.lease_ms = c.replay.lease_ms;
  rc.backpressure =
      c.replay.drop_oldest ? BackpressurePolicy::kDropOldest : BackpressurePolicy::kBlock;
  rc.label = absl::StrCat("run ", c.run.name);
  return rc;
}

absl::Status RunReplayRole(const config::RunConfig& c, const std::string& segment,
                           const std::atomic<bool>& stop) {
  const std::string name = segment.empty() ? c.replay_segment() : segment;
  PRL_ASSIGN_OR_RETURN(std::unique_ptr<RoleMetrics> endpoint, StartRoleMetrics(c.metrics));
  metrics::ProcessMetrics process(*endpoint->registry, metrics::Role::kReplay);
  // The learner beside it creates the segment; wait for it (not ready meanwhile).
  absl::StatusOr<std::unique_ptr<ReplayBuffer>> opened = ReplayBuffer::Open(name);
  while (absl::IsNotFound(opened.status()) && !stop) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    opened = ReplayBuffer::Open(name);
  }
  if (stop && !opened.ok()) return absl::OkStatus();
  PRL_ASSIGN_OR_RETURN(auto buffer, std::move(opened));
  IngestOptions options;
  options.address = c.replay.listen;
  options.max_message_bytes = c.replay.max_message_mb << 20;
  options.write_timeout = absl::Milliseconds(c.replay.write_timeout_ms);
  PRL_ASSIGN_OR_RETURN(auto server, ReplayIngestServer::Start(buffer.get(), options));
  std::printf(
      "serving replay segment %s on port %d (ReplayService, health, reflection)%s; messages up "
      "to %lld MiB, writes wait %lld ms for space\n",
      name.c_str(), server->port(), endpoint->Describe().c_str(),
      static_cast<long long>(c.replay.max_message_mb),
      static_cast<long long>(c.replay.write_timeout_ms));
  std::fflush(stdout);
  endpoint->SetReadiness([] { return absl::OkStatus(); });
  while (!stop) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  endpoint->SetReadiness(nullptr);
  server->Shutdown();
  return absl::OkStatus();
}

}  // namespace prl::roles
