// Sequence: the per-sample state the scheduler and the model runner share (nano-vllm's
// Sequence). Request: one prompt and its n samples (an RL group).
//
// Invariants: tokens = prompt followed by the completion; the first num_computed_tokens
// positions have their K/V in the blocks of block_table; every completion token has a
// behaviour log-prob and the weight version that produced it.
#pragma once

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "inference_engine/sampling_params.h"

namespace prl {

// kPaused: a multi-turn sample between turns, in no queue; it keeps its KV blocks unless the
// scheduler needs them (then it recomputes when it goes on).
enum class SequenceStatus { kWaiting, kRunning, kPaused, kFinished };
enum class FinishReason { kNone, kLength, kStop, kAbort };

const char* FinishReasonName(FinishReason reason);  // "length", "stop", "abort"

struct Request;

struct Sequence {
  Request* request = nullptr;
  int32_t sample_index = 0;     // 0 .. n-1; also the sampler's Philox stream
  std::vector<int32_t> tokens;  // prompt + completion
  int64_t num_prompt_tokens = 0;
  int64_t num_computed_tokens = 0;   // vLLM's num_computed_tokens
  std::vector<int32_t> block_table;  // physical block of each logical block
  std::vector<float> logprobs;       // behaviour log-prob of each completion token
  std::vector<int64_t> versions;     // weight version of each completion token
  SequenceStatus status = SequenceStatus::kWaiting;
  FinishReason finish_reason = FinishReason::kNone;
  // Hash of the last full block registered in the prefix cache (chain state).
  uint64_t last_block_hash = 0;
  int64_t num_hashed_blocks = 0;
  // Multi-turn (SamplingParams::multi_turn): where the current model turn starts in tokens,
  // its token budget, and each completion token's source (0 the model's, 1 an environment's).
  int64_t turn_start = 0;
  int32_t turn_max_tokens = 0;
  std::vector<uint8_t> sources;
  // SamplingParams::top_logprobs: the alternatives of each token of the current turn.
  std::vector<std::vector<std::pair<int32_t, float>>> turn_alternatives;
  // Qwen3-MoE: for each completion token t, the experts of every MoE layer at the position
  // that predicts it (P - 1 + t: the row it was sampled from, or for an environment's token
  // the prefill that read its predecessor), (completion tokens, Lm, K) as the record's routes.
  // Appended as those positions are first computed (recomputation keeps the first).
  std::vector<uint8_t> routes;

  int64_t num_completion_tokens() const {
    return static_cast<int64_t>(tokens.size()) - num_prompt_tokens;
  }
};

struct Request {
  uint64_t id = 0;
  SamplingParams params;
  // samples[0] is the leader: it alone prefills the prompt; the others are forked from it
  // when the prompt is done and share its blocks until they write (copy-on-write).
  std::vector<std::unique_ptr<Sequence>> samples;
  bool forked = false;
  int32_t num_finished = 0;
  // Qwen3-MoE: expert ids recorded per token (MoE layers x top-k; 0: a dense model). A
  // position's routes are recorded when it is first computed, so the prefix cache may skip
  // only positions whose routes a sequence already holds (Scheduler::ApplyPrefixCache).
  int64_t route_width = 0;
  // Engine::AddAdapter's slot of the request's LoRA adapter (-1: none), and the prefix cache's
  // key of its K/V (0 without an adapter): blocks of different adapters never match.
  int32_t adapter_slot = -1;
  uint64_t cache_salt = 0;
};

}  // namespace prl
