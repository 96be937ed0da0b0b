// Held-out evaluation of the run's task (runner/task_source.h): greedy decoding with prl's
// engine of the task's held-out prompts (never trained on), each completion decoded with the
// task's text and scored by its evaluation reward (the arithmetic task: exact match). With an
// environment (env.name), each prompt is a greedy episode against it, run by the actor's own
// episode engine (episode/episode_engine.h), scored by the environment; with an agent
// (agent.address), each is an episode of the agent against an endpoint the evaluation serves,
// greedy unless the agent's calls ask otherwise, scored by the agent.
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
  // Episodes: the share with two or more model turns (the environment answered at least once:
  // the calculator was called, the game went on; an agent called the model twice or more), and
  // the mean model turns.
  double multi_turn_rate = 0, turns_mean = 0;
};

// Greedy (temperature 0) completions of the first `count` held-out prompts, at most
// `max_tokens` tokens each, stopping at the text's stop ids; with a non-empty `environment`
// (EnvironmentOf) greedy episodes within its limits (its max_tokens_per_turn per turn); with an
// `agent` (AgentOf, an address) the agent's episodes instead.
absl::StatusOr<EvalResult> Evaluate(std::shared_ptr<const ParameterSet> weights,
                                    const TaskSource& task, int64_t count, int32_t max_tokens,
                                    const prl::v1::EnvironmentSpec& environment = {},
                                    const prl::v1::AgentSpec& agent = {});

}  // namespace prl::runner
