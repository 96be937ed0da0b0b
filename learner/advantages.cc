#include "learner/advantages.h"

#include <cmath>
#include <unordered_map>

#include "absl/strings/str_cat.h"

namespace prl::learner {

absl::StatusOr<Advantages> GroupAdvantages(absl::Span<const double> rewards,
                                           absl::Span<const std::string> group_ids,
                                           const AdvantageConfig& config) {
  if (group_ids.size() != rewards.size()) {
    return absl::InvalidArgumentError(absl::StrCat("advantages: group_ids has ", group_ids.size(),
                                                   " entries, expected ", rewards.size(),
                                                   " (one per reward)"));
  }
  if (!std::isfinite(config.eps) || config.eps < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("advantage config: eps must be finite and >= 0, found ", config.eps));
  }
  std::vector<std::vector<int64_t>> groups;  // sample indices, in input order
  std::unordered_map<std::string, size_t> group_of;
  for (size_t i = 0; i < rewards.size(); ++i) {
    if (!std::isfinite(rewards[i])) {
      return absl::InvalidArgumentError(absl::StrCat("advantages: reward of sample ", i,
                                                     " (group \"", group_ids[i], "\") is ",
                                                     rewards[i], ", expected a finite number"));
    }
    const auto [it, inserted] = group_of.try_emplace(group_ids[i], groups.size());
    if (inserted) groups.emplace_back();
    groups[it->second].push_back(static_cast<int64_t>(i));
  }

  Advantages out;
  out.advantage.assign(rewards.size(), 0.0);
  out.kept.assign(rewards.size(), true);
  out.groups = static_cast<int64_t>(groups.size());
  for (const std::vector<int64_t>& g : groups) {
    const double n = static_cast<double>(g.size());
    double mean = 0;
    bool uniform = true;  // a group of one included
    for (int64_t i : g) {
      mean += rewards[i];
      uniform = uniform && rewards[i] == rewards[g.front()];
    }
    mean /= n;
    if (uniform) {
      if (config.drop_uniform_groups) {
        ++out.dropped_groups;
        for (int64_t i : g) out.kept[i] = false;
      }
      continue;  // advantage exactly 0, whatever the rounding of the mean
    }
    // Two passes: the sum of squared deviations, not E[r^2] - mean^2, which cancels badly.
    double squares = 0;
    for (int64_t i : g) squares += (rewards[i] - mean) * (rewards[i] - mean);
    const double stddev = std::sqrt(squares / (n - 1));  // Bessel-corrected
    for (int64_t i : g) {
      // GRPO: A = (r - mean) / (std + eps);  Dr. GRPO: A = r - mean
      out.advantage[i] =
          config.scale_by_std ? (rewards[i] - mean) / (stddev + config.eps) : rewards[i] - mean;
    }
  }
  return out;
}

}  // namespace prl::learner
