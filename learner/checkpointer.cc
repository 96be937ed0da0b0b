#include "learner/checkpointer.h"

#include "core/status_macros.h"

namespace prl::learner {

absl::StatusOr<std::optional<TrainingState>> Checkpointer::Resume(
    FsdpModel& model, ShardedOptimizer& optimizer) const {
  if (policy_.dir.empty()) return std::nullopt;
  return LoadLatestCheckpoint(policy_.dir, model, optimizer);
}

bool Checkpointer::Due(int64_t step) const {
  if (policy_.dir.empty() || step <= 0) return false;
  return step % policy_.every == 0 || (policy_.last_step > 0 && step == policy_.last_step);
}

absl::StatusOr<bool> Checkpointer::AfterStep(const TrainingState& state, FsdpModel& model,
                                             ShardedOptimizer& optimizer,
                                             const CheckpointExtras& extras) const {
  if (!Due(state.step)) return false;
  PRL_RETURN_IF_ERROR(
      SaveCheckpoint(policy_.dir, model, optimizer, state, policy_.keep_last, extras));
  return true;
}

}  // namespace prl::learner
