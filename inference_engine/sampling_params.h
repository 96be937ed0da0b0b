// What a request asks of the sampler (vLLM's SamplingParams, minus the text options).
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"

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
};

// Errors name the field and the expected and found values.
absl::Status ValidateSamplingParams(const SamplingParams& params, int64_t vocab_size);

}  // namespace prl
