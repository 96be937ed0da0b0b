// The coordinator role (`prl coordinator`): the prompt-set service (PromptService for
// clients, ActorControl for actors and the learner) on coordinator.listen, its durable prompt
// log, and /metrics, until the stop flag is set.
#pragma once

#include <atomic>

#include "absl/status/statusor.h"
#include "config/run_config.h"
#include "coordinator/coordinator.h"

namespace prl::roles {

// The coordinator's settings from the run: leases, the staleness budget (learner.max_lag,
// learner.groups_per_step; sync mode's budget of one step), the model's limits (model.path
// must name the model directory), its text (roles/model_text.h; none: token prompts only) and
// the reward check.
absl::StatusOr<coordinator::CoordinatorConfig> CoordinatorConfigFrom(const config::RunConfig& c);

absl::Status RunCoordinatorRole(const config::RunConfig& config, const std::atomic<bool>& stop);

}  // namespace prl::roles
