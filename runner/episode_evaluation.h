// The held-out evaluation of a task with an environment (runner/evaluation.h): one greedy
// episode per held-out prompt, run by the episode engine the actors use
// (episode/episode_engine.h: the same turn ends, reply rendering and limits as in training),
// scored by the environment. With an agent (its address set), each is the agent's episode
// against an OpenAI-compatible endpoint the evaluation serves on loopback, scored by the agent.
// An episode the environment (or the agent) fails (malformed answers, down longer
// than the outage budget) is an error naming it: an evaluation does not score what it could not
// run. A turn's length is the environment's max_tokens_per_turn.
//
// Thread-safety: one call runs on its thread (the environments' call threads are joined before
// it returns).
#pragma once

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "model/parameters.h"
#include "prl/v1/prompt.pb.h"
#include "runner/evaluation.h"
#include "runner/task_source.h"

namespace prl::runner {

absl::StatusOr<EvalResult> EvaluateEpisodes(std::shared_ptr<const ParameterSet> weights,
                                            const TaskSource& task, int64_t count,
                                            const prl::v1::EnvironmentSpec& environment,
                                            const prl::v1::AgentSpec& agent = {});

}  // namespace prl::runner
