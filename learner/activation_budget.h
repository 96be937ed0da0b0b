// The learner's activation budget (learner.activation_budget_mb): what a rank's training pass may
// lay out for its activations, logits chunk and backward scratch (Transformer::PlanPassBytes),
// checked before a pass runs, never discovered by running out of memory midway.
//
// - The step splits a micro-batch whose pass would exceed the budget (train_step.h).
// - A sequence whose pass alone exceeds it cannot be trained: the learner's admission refuses its
//   group before any step (replay/group_validation.h, reason "context"), naming the settings that
//   would fit it: the checkpointing modes' limits under the same budget, and the budget it needs.
// The budget covers the policy's pass workspace only; FSDP's parameter and gradient buffers are
// FsdpMemory's, the reference model's pass its own.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <string>

#include "core/device.h"
#include "model/config.h"
#include "learner/fsdp.h"
#include "model/transformer.h"

namespace prl::learner {

// What a training pass's workspace depends on besides its batch.
struct PassPlanner {
  ModelConfig config;
  Device device = Device::Cpu();
  TransformerOptions options;
  int64_t lora_rank = 0;  // 0: no adapters
  // learner.context_parallel: a rank's pass holds its share of each sequence (at most
  // tokens / C + 2 per sequence) and the group's gathered keys and values.
  int context_parallel = 1;
  ContextAttention context_attention = ContextAttention::kAllGather;  // with context_parallel > 1
  int64_t lora_segments = 1;  // a joint pass over several adapters' micro-batches: their number

  // Bytes of a training pass over `tokens` input tokens in `seqs` sequences: the most a pass
  // of those tokens lays out, whichever of them are trained.
  int64_t PassBytes(int64_t tokens, int64_t seqs) const;
  // The longest sequence (prompt + completion tokens; its pass reads one fewer) whose training
  // pass fits budget_bytes, up to the model's context; 0 when not even 2 tokens fit.
  int64_t MaxSequenceTokens(int64_t budget_bytes) const;
  // For a refusal, what would fit a longer sequence: "learner.activation_budget_mb = 64 with
  // learner.activation_checkpointing = none; selective fits 9000 tokens, full 20000, or raise
  // the budget".
  std::string DescribeLimits(int64_t budget_bytes) const;
  // The budget (MiB, rounded up) a sequence of `sequence_tokens` needs with these settings.
  int64_t BudgetMbFor(int64_t sequence_tokens) const;
};

// The planner of `model`'s training passes (its settings, adapter and context-parallel group).
PassPlanner PlannerOf(const FsdpModel& model);

}  // namespace prl::learner
