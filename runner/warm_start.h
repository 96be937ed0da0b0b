// The first two stages of `prl run`: the model to start from (model.path, or one created from
// model.preset with the built-in task's character vocabulary) and the supervised warm-start
// (`prl learner train --loss sft` on the task's train split, as a child process).
#pragma once

#include <atomic>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "config/run_config.h"
#include "runner/task_source.h"

namespace prl::runner {

// model.path when set; else <run dir>/model-init, created from model.preset with the built-in
// task's character vocabulary (or, with `resume`, reused). The prompts task needs model.path.
absl::StatusOr<std::string> PrepareStartModel(const config::RunConfig& config, bool resume);

// The model a run's RL started from, once its warm-start is over: <run dir>/model-sft when the
// warm-start made one, else what PrepareStartModel gave (model.path, or <run dir>/model-init).
std::string RlStartModel(const config::RunConfig& config);

struct WarmStartResult {
  std::string model;  // the model RL starts from
  double seconds = 0;
};

// A task the warm-start teaches: the run's own, or a tenant's (its config from
// RunConfig::ForTenant). Both must outlive the call.
struct SftTask {
  const config::RunConfig* config;
  const TaskSource* task;
};

// Runs sft.steps supervised steps from `start_model` on the tasks' warm-start examples, an
// equal share of each, interleaved (none when sft.steps is 0; with `resume`, an earlier run's
// model-sft is reused). CANCELLED when *interrupted becomes true.
absl::StatusOr<WarmStartResult> WarmStart(const config::RunConfig& config,
                                          const std::vector<SftTask>& tasks,
                                          const std::string& start_model,
                                          const std::string& prl_path, bool resume,
                                          const std::atomic<bool>* interrupted);

}  // namespace prl::runner
