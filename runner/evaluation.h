// Held-out evaluation of the built-in arithmetic task: greedy decoding with prl's engine on
// problems of the held-out split (never trained on), scored by the task's exact verifier.
// `prl run` reports it before RL (eval_before) and after (eval_after).
#pragma once

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "model/parameters.h"
#include "task/arithmetic_task.h"

namespace prl::runner {

struct EvalResult {
  double accuracy = 0;  // mean exact reward in [0, 1]
  int64_t problems = 0;
  double seconds = 0;
};

// Greedy (temperature 0) completions of the first `num_problems` held-out problems for
// `seed`, at most `max_tokens` tokens each, stopping at EOS.
absl::StatusOr<EvalResult> EvaluateArithmetic(std::shared_ptr<const ParameterSet> weights,
                                              const task::ArithmeticConfig& task,
                                              int64_t num_problems, uint64_t seed,
                                              int32_t max_tokens);

}  // namespace prl::runner
