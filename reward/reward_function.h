// The reward interface actors call once per finished group: built-in verifiers
// (reward/verifiers.h) and the client of an external RewardService (reward/reward_service.h)
// implement it.
//
// Failure is per group: when ScoreBatch returns an error, no sample of the batch has a reward.
// Callers must fail the group visibly (log, count, re-queue or abort the prompt) and never
// write part of it or drop a sample silently, since the learner normalises advantages within
// the group.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace prl::reward {

// One finished sample as a verifier sees it.
struct RewardInput {
  std::string prompt;      // prompt text
  std::string completion;  // completion text, without the stop token (EOS)
  std::string reference;   // reference answer from the prompt set; may be empty
  std::vector<int32_t> prompt_tokens;
  std::vector<int32_t> completion_tokens;  // as sampled, stop token included
  uint64_t group_id = 0;                   // samples of one prompt share it
};

struct RewardResult {
  double reward = 0;                         // finite
  std::map<std::string, double> components;  // named parts, for reporting only; may be empty
};

// Implementations are thread-safe: one instance serves every generation thread of an actor.
class RewardFunction {
 public:
  virtual ~RewardFunction() = default;

  // One sample's reward (finite). An error means the sample cannot be scored (e.g. a reward
  // that needs a reference answer got none), not that the completion is wrong (that is 0).
  virtual absl::StatusOr<double> Score(const RewardInput& input) = 0;

  // The rewards of a batch (usually one group), one per input in order. The default calls
  // Score for each input (components empty) and fails the whole batch on the first error,
  // naming the sample's index. Remote rewards override it to make one call per batch.
  virtual absl::StatusOr<std::vector<RewardResult>> ScoreBatch(
      absl::Span<const RewardInput> inputs);
};

}  // namespace prl::reward
