// Checkpointer: the learner's one place that decides when to checkpoint and resumes from the
// latest checkpoint (learner/checkpoint.h has the format). `prl learner train` and the learner
// role (LearnerService) both step through it, so the rule is stated once: a checkpoint after
// every `every` steps and after the last step of a bounded run.
//
// Both methods are collectives: every rank calls them, in the same order.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "learner/checkpoint.h"
#include "learner/fsdp.h"
#include "learner/optimizer.h"

namespace prl::learner {

struct CheckpointPolicy {
  std::string dir;        // empty: no checkpoints (and nothing to resume from)
  int64_t every = 100;    // steps between checkpoints, >= 1
  int keep_last = 2;      // newest checkpoints kept, >= 1
  int64_t last_step = 0;  // the run's final step, always checkpointed (0: unbounded run)
};

class Checkpointer {
 public:
  explicit Checkpointer(CheckpointPolicy policy) : policy_(std::move(policy)) {}

  // Loads the latest checkpoint into model and optimizer; nullopt when there is none (or
  // checkpoints are off).
  absl::StatusOr<std::optional<TrainingState>> Resume(FsdpModel& model,
                                                      ShardedOptimizer& optimizer) const;
  // Whether the step that brought the learner to `state.step` ends with a checkpoint.
  bool Due(int64_t step) const;
  // Saves `state` when Due(state.step); returns whether it saved.
  absl::StatusOr<bool> AfterStep(const TrainingState& state, FsdpModel& model,
                                 ShardedOptimizer& optimizer,
                                 const CheckpointExtras& extras = nullptr) const;

  const CheckpointPolicy& policy() const { return policy_; }

 private:
  CheckpointPolicy policy_;
};

}  // namespace prl::learner
