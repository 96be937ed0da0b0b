// The reward role (`prl reward serve`): the run's task reward (task.reward; task.credit for
// the arithmetic reward) served as a gRPC RewardService on reward.listen, until the stop flag
// is set. Prompt sets reach it with the reward {"name": "remote", "params": {"address": ...}};
// a verifier pod in a fleet, or a reference server for users writing their own.
#pragma once

#include <atomic>

#include "absl/status/status.h"
#include "config/run_config.h"
#include "reward/verifiers.h"

namespace prl::roles {

// The reward of the run's task: task.reward with task.reward_params (the arithmetic reward's
// credit is task.credit). prl run trains with it too.
reward::RewardSpec TaskRewardSpec(const config::RunConfig& config);

absl::Status RunRewardRole(const config::RunConfig& config, const std::atomic<bool>& stop);

}  // namespace prl::roles
