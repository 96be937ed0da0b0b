// The first two stages of `prl run`: the model to start from (model.path, or one created from
// model.preset with the built-in task's character vocabulary) and the supervised warm-start
// (`prl learner train --loss sft` on the task's train split, as a child process).
#pragma once

#include <atomic>
#include <string>

#include "absl/status/statusor.h"
#include "config/run_config.h"
#include "task/arithmetic_task.h"

namespace prl::runner {

task::ArithmeticConfig TaskConfig(const config::RunConfig& config);

// model.path when set; else <run dir>/model-init, created (or, with `resume`, reused).
absl::StatusOr<std::string> PrepareStartModel(const config::RunConfig& config, bool resume);

struct WarmStartResult {
  std::string model;  // the model RL starts from
  double seconds = 0;
};

// Runs sft.steps supervised steps from `start_model` (none when sft.steps is 0; with `resume`,
// an earlier run's model-sft is reused). CANCELLED when *interrupted becomes true.
absl::StatusOr<WarmStartResult> WarmStart(const config::RunConfig& config,
                                          const std::string& start_model,
                                          const std::string& prl_path, bool resume,
                                          const std::atomic<bool>* interrupted);

}  // namespace prl::runner
