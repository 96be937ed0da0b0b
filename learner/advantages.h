// Group-normalised advantages (GRPO and Dr. GRPO) from per-sample rewards.
//
// GRPO: A = (r - mean_g) / (std_g + eps), std over the group with Bessel's correction (as
// TRL and PipelineRL compute it); Dr. GRPO: A = r - mean_g (no std). A group of one has
// advantage 0. drop_uniform_groups removes groups whose rewards are all equal, groups of one
// included (they carry no signal under either normalisation), and reports how many were
// dropped; uniform groups that are kept get advantage exactly 0.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "config/learner_kinds.h"
#include "core/enum_names.h"

namespace prl::learner {

struct AdvantageConfig {
  bool scale_by_std = true;  // false: Dr. GRPO
  double eps = 1e-6;
  bool drop_uniform_groups = false;
};

struct Advantages {
  std::vector<double> advantage;  // per sample, in input order
  std::vector<bool> kept;         // false for samples of dropped groups
  int64_t groups = 0;
  int64_t dropped_groups = 0;
};

// rewards[i] belongs to group group_ids[i]; groups may interleave. Non-finite rewards are an
// error naming the sample.
absl::StatusOr<Advantages> GroupAdvantages(absl::Span<const double> rewards,
                                           absl::Span<const std::string> group_ids,
                                           const AdvantageConfig& config);

}  // namespace prl::learner
