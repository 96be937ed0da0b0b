// What a request asks of the sampler (vLLM's SamplingParams, minus the text options).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace prl {

struct SamplingParams {
  int32_t n = 1;             // samples per prompt (the RL group); they share the prompt
  float temperature = 1.0f;  // 0 = greedy (see kernels/sampling.h for its log-prob)
  float top_p = 1.0f;        // nucleus mass in (0, 1]; 1 disables
  int32_t top_k = 0;         // 0 disables
  int32_t max_tokens = 16;   // completion tokens at most
  // Sampling one of these ends the sample with finish_reason "stop"; the token is kept in the
  // completion (the policy chose to stop, and the learner trains on that choice).
  std::vector<int32_t> stop_token_ids;
  uint64_t seed = 0;  // with the sample index and position, fixes every draw
  // Agentic episodes (Engine::TakeTurns): a sample whose turn ends (a stop token, max_tokens,
  // Engine::EndTurn) is paused with its KV cache instead of finished, to go on with the
  // environment's reply (Engine::Continue) or be finished (Engine::FinishSample). max_tokens
  // is then the first turn's budget.
  bool multi_turn = false;
  // Multi-turn: called after each token a turn samples, with the turn's tokens so far; true
  // ends the turn there (reason kStop), e.g. once its text ends with an environment's stop
  // string. Null: only stop tokens and max_tokens end a turn. Runs on the engine's thread.
  std::function<bool(absl::Span<const int32_t> turn_tokens)> end_turn;
  // Multi-turn: the most likely alternatives (0 to 20) of each token a turn samples, with their
  // log-probs under the distribution it was drawn from (TurnOutput::alternatives; the OpenAI
  // endpoint's top_logprobs). Each costs a copy of the token's logits row to the host.
  int32_t top_logprobs = 0;
  // Multi-turn: tokens after the prompt, before the first turn samples: context (source 1,
  // log-prob 0, never trained), in the completion's arrays as Engine::Continue's tokens are,
  // e.g. a forced tool call's opening (episode/trajectory.h ForcedOpening). The prompt stays
  // what was rendered; max_tokens counts only what the turn samples.
  std::vector<int32_t> context_after_prompt;
};

// What a multi-turn sample's next turn samples with (Engine::Continue), when it changes.
struct TurnSampling {
  float temperature = 1.0f;
  float top_p = 1.0f;
  uint64_t seed = 0;
  int32_t top_logprobs = 0;
};

// Errors name the field and the expected and found values.
absl::Status ValidateSamplingParams(const SamplingParams& params, int64_t vocab_size);

}  // namespace prl
