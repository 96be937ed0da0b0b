#include "reward/reward_function.h"

#include "absl/strings/str_cat.h"

namespace prl::reward {

absl::StatusOr<std::vector<RewardResult>> RewardFunction::ScoreBatch(
    absl::Span<const RewardInput> inputs) {
  std::vector<RewardResult> results(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    absl::StatusOr<double> reward = Score(inputs[i]);
    if (!reward.ok()) {
      return absl::Status(reward.status().code(),
                          absl::StrCat("sample ", i, " (group ", inputs[i].group_id,
                                       "): ", reward.status().message()));
    }
    results[i].reward = *reward;
  }
  return results;
}

}  // namespace prl::reward
