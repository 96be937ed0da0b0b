// Warm-start demonstrations of a built-in environment (docs/environments.md): whole episodes
// that a scripted player plays against the environment itself, every reply rendered as the
// actor renders it (episode/turn_renderer.h), so that the supervised warm-start teaches exactly
// the token format the episodes of RL and of the evaluation then have. The player's turns are
// the model's tokens (trained); the environment's replies are context (sources 1).
//
//   calculator    the player calls the tool on the prompt's whole expression
//                 (call_open + "734*58" + call_close), then answers the tool's result (the
//                 reply's last integer); the examples that do not demonstrate
//                 (1 - sft.env_demo_fraction) answer at once.
//   guess_number  the player bisects the range the feedback leaves; those that do not
//                 demonstrate guess its first quarter (a worse search: with 6 guesses over
//                 [1, 50] it finds 60% of the secrets, bisection all).
//
// A demonstration must end as the environment's win: one that does not (a calculator whose
// call syntax the codec cannot write) is an error naming the prompt. The examples that do not
// demonstrate may lose (the quarter guesser): they show the imperfect play RL starts from.
//
// Thread-safety: free functions.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "config/run_config.h"
#include "prl/v1/prompt.pb.h"
#include "runner/task_source.h"
#include "tokenizer/text_codec.h"

namespace prl::runner {

// Whether `environment` (EnvironmentOf) has demonstrations for `task`'s prompts: the built-in
// calculator with the arithmetic task (its prompts are expressions), the built-in game with the
// guess_number task. Other tasks warm-start on their references (SftExamples).
bool HasDemonstrations(const prl::v1::EnvironmentSpec& environment, config::TaskName task);

// The warm-start examples of `prompts`: example i demonstrates the environment iff its place in
// a low-discrepancy sequence falls below demo_fraction (so any prefix has about that share).
// A turn over environment.max_tokens_per_turn, an episode reaching max_episode_tokens or
// max_sequence_tokens (the model's context) is an error naming the setting to raise: RL's
// episodes would be cut where the demonstrations are not.
absl::StatusOr<std::vector<SftExample>> Demonstrations(const prl::v1::EnvironmentSpec& environment,
                                                       config::TaskName task,
                                                       const tokenizer::TextCodec& codec,
                                                       absl::Span<const prl::v1::Prompt> prompts,
                                                       int64_t vocab_size, double demo_fraction,
                                                       int64_t max_sequence_tokens);

}  // namespace prl::runner
