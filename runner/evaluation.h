// Held-out evaluation of the run's task (runner/task_source.h): greedy decoding with prl's
// engine of the task's held-out prompts (never trained on), each completion decoded with the
// task's text and scored by its evaluation reward (the arithmetic task: exact match).
// `prl run` reports it before RL (eval_before) and after (eval_after).
#pragma once

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "model/parameters.h"
#include "runner/task_source.h"

namespace prl::runner {

struct EvalResult {
  double accuracy = 0;  // mean reward over the prompts (the arithmetic task: exact, in [0, 1])
  int64_t problems = 0;
  double seconds = 0;
};

// Greedy (temperature 0) completions of the first `count` held-out prompts, at most
// `max_tokens` tokens each, stopping at the text's stop ids.
absl::StatusOr<EvalResult> Evaluate(std::shared_ptr<const ParameterSet> weights,
                                    const TaskSource& task, int64_t count, int32_t max_tokens);

}  // namespace prl::runner
