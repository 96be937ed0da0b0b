// The coordinator settings the coordinator suites share: a durable log in `dir`, a small
// vocabulary and context, leases that do not expire during a test, and any reward accepted.
#pragma once

#include <filesystem>

#include "absl/status/status.h"
#include "coordinator/coordinator.h"

namespace prl::coordinator {

inline CoordinatorConfig TestCoordinatorConfig(const std::filesystem::path& dir) {
  CoordinatorConfig c;
  c.log_path = (dir / "prompts.log").string();
  c.vocab_size = 50;
  c.max_position_embeddings = 64;
  c.lease_ms = 60'000;
  c.heartbeat_ms = 1'000;
  c.validate_reward = [](const prl::v1::RewardSpec&) { return absl::OkStatus(); };
  return c;
}

}  // namespace prl::coordinator
