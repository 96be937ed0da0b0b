// Transformer: the Llama / Qwen2 decoder's training and scoring passes over a PackedBatch.
//
// Forward computes, for every position with a target, log softmax(logits / temperature) of
// that target; Backward accumulates the gradient of sum_t dlogprobs[t] * logprob[t] into a
// gradient ParameterSet view. Parameters arrive as views (ModelParams) rather than being owned,
// so the learner's FSDP can hand in gathered blocks and the engine can share the weights.
//
// Memory: Forward(for_backward = true) keeps per layer ~ (3 C + QKV + H D + 3 I) floats per
// token; without it two layers' worth are reused. The (T, V) logits never exist in full
// (kernels/logprob.h). Not thread-safe: one Transformer per thread of work.
#pragma once

#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "core/arena.h"
#include "kernels/reduction_order.h"
#include "model/config.h"
#include "model/packed_batch.h"
#include "model/parameters.h"

namespace prl {

struct TransformerOptions {
  // Upper bound on the logits chunk of the LM head. 64 MiB keeps a chunk in the last-level
  // cache's neighbourhood while leaving GEMMs of >= 128 rows for vocabularies up to 128k.
  int64_t logits_chunk_bytes = int64_t{64} << 20;
  // kBatchInvariant makes Forward's log-probs bit-identical to the engine's behaviour
  // log-probs in the same mode (kernels/reduction_order.h); Backward is unaffected.
  kernels::ReductionOrder reduction_order = kernels::ReductionOrder::kFast;
};

class Transformer {
 public:
  // `config` must be valid (ValidateModelConfig) and `device`'s kernel backend available.
  Transformer(const ModelConfig& config, Device device, TransformerOptions options = {});
  ~Transformer();
  Transformer(const Transformer&) = delete;
  Transformer& operator=(const Transformer&) = delete;

  // logprobs (T) receives the log-probability of each position's target (0 where none).
  // The batch is validated here; errors name the offending sequence.
  absl::Status Forward(const ModelParams& params, const PackedBatch& batch, float temperature,
                       absl::Span<float> logprobs, bool for_backward);

  // grads += d(sum_t dlogprobs[t] * logprob[t]) / d(params). Needs the immediately preceding
  // Forward(for_backward = true) with the same params; dlogprobs (T) is ignored where there
  // was no target.
  absl::Status Backward(const ModelParams& params, absl::Span<const float> dlogprobs,
                        const ModelParams& grads);

  const ModelConfig& config() const { return config_; }
  // Bytes currently held for activations and scratch.
  size_t workspace_bytes() const;

 private:
  struct Workspace;

  void ForwardLayer(const LayerParams& p, int64_t layer);
  void BackwardLayer(const LayerParams& p, const LayerParams& g, int64_t layer);

  ModelConfig config_;
  Device device_;
  TransformerOptions options_;
  std::vector<float> inv_freq_;  // (D/2) RoPE inverse frequencies
  Arena arena_;
  std::unique_ptr<Workspace> ws_;
};

}  // namespace prl
