// Transformer: the Llama / Qwen2 / Qwen3 / Qwen3-MoE decoder's training and scoring passes over
// a PackedBatch (whose routes, for Qwen3-MoE, may replay recorded experts: model/moe_layer.h).
//
// Forward computes, for every position with a target, log softmax(logits / temperature) of
// that target; Backward accumulates the gradient of sum_t dlogprobs[t] * logprob[t] into a
// gradient ParameterSet view. Parameters arrive as views (ModelParams) rather than being owned,
// so the learner's FSDP can hand in gathered blocks and the engine can share the weights.
//
// Memory: Forward(for_backward = true) keeps per layer ~ (3 C + QKV + H D + 3 I) floats per
// token (Qwen3: + (H + KV) (D + 1)); without it two layers' worth are reused. The (T, V)
// logits never exist in full (kernels/logprob.h). Not thread-safe: one Transformer per thread of
// work.
#pragma once

#include <memory>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "core/arena.h"
#include "kernels/reduction_order.h"
#include "model/activation_checkpointing.h"
#include "model/config.h"
#include "model/context_parallel.h"
#include "model/decoder_layer.h"
#include "model/packed_batch.h"
#include "model/parameters.h"

namespace prl {

struct TransformerOptions {
  // Models that never run a pass at the same time (a run of adapters' trainers on one rank,
  // which take turns: learner/step_turns.h) may lay out their passes in one workspace: the
  // largest pass's bytes once instead of once per model. Each Forward lays its pass out again,
  // so a model's activations live from its Forward to its Backward only. Null: the model's own.
  std::shared_ptr<Arena> shared_workspace;
  // Upper bound on the logits chunk of the LM head. 64 MiB keeps a chunk in the last-level
  // cache's neighbourhood while leaving GEMMs of >= 128 rows for vocabularies up to 128k.
  // On a GPU (where a chunk of 64 MiB is ~100 rows of a 152k vocabulary, too few for the
  // GEMM) 0 means 1 GiB.
  int64_t logits_chunk_bytes = 0;  // 0: 64 MiB on the CPU, 1 GiB on a GPU
  // Training passes (Forward with for_backward): when one chunk holds the logits of every
  // trained row, Backward reads the logits Forward left in it instead of computing them again
  // (the LM head's forward GEMM, a large share of a small model's FLOPs, runs once); the
  // results are the recomputing pass's (bit for bit on the CPU). Unset: on for the CPU, off on
  // CUDA until a GPU session has verified it (cuda_transformer_test's kept-logits case).
  std::optional<bool> keep_logits;
  // With keep_logits: a budget above logits_chunk_bytes makes one chunk of every trained row
  // when R x V x 4 bytes fit it (memory for speed on a GPU: 8192 rows of a 152k vocabulary
  // take 5 GB; the bf16 mode's backward takes half as much again for the chunk's BF16 dlogits).
  // 0: logits_chunk_bytes alone decides. A pass over several adapters' segments (ModelParams::
  // lora_segments) keeps its logits within segments x logits_chunk_bytes at least: the chunks
  // its adapters' own passes would keep, so that joining them never computes the LM head twice.
  int64_t keep_logits_bytes = 0;
  // kBatchInvariant makes Forward's log-probs bit-identical to the engine's behaviour
  // log-probs in the same mode (kernels/reduction_order.h); Backward is unaffected.
  kernels::ReductionOrder reduction_order = kernels::ReductionOrder::kFast;
  // Storage of the activations and of the parameters Forward/Backward are given: F32, or BF16
  // on CUDA (the bf16 mode: parameters from ToComputeDType, fp32 accumulation in every kernel;
  // gradients are always F32).
  DType compute_dtype = DType::kF32;
  // CUDA, fast order: the residual adds read by the projections' GEMMs (LayerContext::
  // residual_in_gemm) instead of a copy each. Off until verified on a GPU.
  bool residual_in_gemm = false;
  // CUDA with LoRA adapters (ModelParams::lora, F32, beside F32 or BF16 compute; model/
  // lora_layer.h): the adapters' column kernels (kernels/cuda/lora_columns.cu) and a frozen
  // base's backward are written but have not run on a GPU; off (adapters on CUDA refused) until
  // a GPU session passes cuda_lora_test (the learner turns it on with learner.cuda_lora).
  bool cuda_lora = false;
  // CUDA with context parallelism by Ulysses (model/context_heads.h): the packed CUDA attention
  // over each rank's heads, the exchanges over NCCL, strided copies on the device. Written, not
  // yet run on a GPU; off (context parallelism on CUDA refused) until a GPU session passes
  // CudaTransformerContextParallelTest (learner.cuda_context_parallel turns it on).
  bool cuda_context_parallel = false;
  // Training passes: which activations Forward keeps for Backward, which Backward recomputes
  // (model/activation_checkpointing.h: none, selective, full). Gradients are none's bit for
  // bit on the CPU.
  ActivationCheckpointing activation_checkpointing = ActivationCheckpointing::kNone;
};

// How FSDP (learner/fsdp.h) takes part in the passes. A pass announces every parameter unit
// (ParameterLayout::unit_ranges: 0 the embedding, 1..L the layers, L + 1 the final norm with
// the untied head) before it reads it and after, so that a unit's full parameters, and in
// Backward its gradient views, need to be bound in the ModelParams the pass was given only
// while the pass uses them. Without hooks every unit is assumed bound throughout.
//
// Order: Forward acquires 0, 1, ..., L + 1 (and 0 again beside L + 1 when the embedding is
// tied); Backward acquires L + 1 (and 0 when tied), L, ..., 1, then 0 for the embedding's
// gradient only (need_params = false). A tied embedding's gradient is done at its last
// release.
class UnitHooks {
 public:
  enum class Pass { kForward, kBackward };
  virtual ~UnitHooks() = default;
  // When this returns, unit `unit`'s parameters (if need_params) and, in Backward, its
  // gradient views are bound. Gradients accumulate: a unit's first acquire in a Backward
  // must bind zeroed (or to-be-accumulated) gradient memory.
  virtual absl::Status Acquire(int unit, Pass pass, bool need_params) = 0;
  // The pass is done with the unit for now; in Backward, gradient_done says its gradient for
  // this batch is complete (the moment to reduce-scatter it).
  virtual absl::Status Release(int unit, Pass pass, bool gradient_done) = 0;
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
  // With hooks, `params` may change between layers (the hooks rebind it); it is read lazily.
  // With `context`, a context-parallel pass over this rank's share of a batch
  // (model/context_parallel.h): `batch` is ShardBatch(full, rank, size) and every rank of the
  // group runs the pass (and its Backward) in step, the group's collectives inside them. CPU and
  // F32 only for now.
  absl::Status Forward(const ModelParams& params, const PackedBatch& batch, float temperature,
                       absl::Span<float> logprobs, bool for_backward, UnitHooks* hooks = nullptr,
                       const ContextShard* context = nullptr);

  // grads += d(sum_t dlogprobs[t] * logprob[t] + load_balancing_weight * aux) / d(params),
  // aux the last Forward's load_balancing_loss(). Needs the immediately preceding
  // Forward(for_backward = true) with the same params; dlogprobs (T) is ignored where there
  // was no target. With LoRA adapters (params.lora) their gradients accumulate in grads.lora;
  // grads without layers (a frozen base: ModelParams{} with .lora set) skip every base
  // weight's gradient (CPU only for now). With several adapters' segments (params.
  // lora_segments: a frozen base, CPU, no load-balancing weight), grads.lora_segments names the
  // same segments, each with its adapter's gradients: each adapter's gradient is the one a pass
  // over its segment alone would give (up to float summation order).
  absl::Status Backward(const ModelParams& params, absl::Span<const float> dlogprobs,
                        const ModelParams& grads, UnitHooks* hooks = nullptr,
                        double load_balancing_weight = 0.0);

  const ModelConfig& config() const { return config_; }
  // Qwen3-MoE: the experts the router chose in the last Forward, (T, Lm, K) token-major as the
  // record's routes (replay/rollout_record.h): entry (t * Lm + l) * K + k is position t's k-th
  // expert in the l-th MoE layer. Replayed positions report the router's choice too, so a
  // caller can count where it differs from the replayed one. Empty for a dense model.
  absl::Span<const uint8_t> recomputed_routes() const;
  // The entropy (nats) of each position's distribution softmax(z) in the last
  // Forward(for_backward = true), (T); 0 where there was no target (and after a forward-only
  // pass, which skips it, and on CUDA until its kernel is verified on a GPU). Where a position
  // is trained, the policy's entropy there.
  absl::Span<const float> entropies() const;
  // Qwen3-MoE: the load-balancing loss (model/moe_layer.h: E sum_e f_e P_e) over the tokens
  // and MoE layers of the last Forward; 0 for a dense model.
  double load_balancing_loss() const;
  // With several adapters' segments (ModelParams::lora_segments): the load-balancing loss of
  // each segment's tokens alone, as a pass over that segment would compute it; (segments).
  absl::Span<const double> segment_load_balancing_losses() const;
  // Bytes currently held for activations and scratch (the largest pass's so far).
  size_t workspace_bytes() const;
  // Bytes the last Forward laid out for its activations, logits chunk and (training passes)
  // the backward's scratch: the pass's peak workspace.
  size_t last_pass_bytes() const;
  // The bytes a pass over `tokens` tokens in `seqs` sequences, `target_rows` of them with a
  // target, would lay out (last_pass_bytes()), without running it: for planning micro-batches
  // against a memory budget. lora_rank: the adapters' rank (0: none).
  size_t PlanPassBytes(int64_t tokens, int64_t seqs, int64_t target_rows, bool for_backward,
                       int64_t lora_rank = 0, int64_t lora_segments = 1) const;

 private:
  struct Workspace;

  struct PassShape;
  void LayOut(Arena& arena, Workspace& ws, const PassShape& shape) const;
  PassShape ShapeOf(int64_t tokens, int64_t seqs, int64_t target_rows, bool for_backward,
                    int64_t lora_rank, int64_t lora_segments) const;
  LayerContext ContextOf(const LayerParams& p, int64_t layer, const int32_t* forced_routes) const;
  absl::Status ForwardLayer(const LayerParams& p, int64_t layer);
  // Checkpointing: the activations of `layer` Forward did not keep, again, before its backward.
  absl::Status RecomputeLayer(const LayerParams& p, int64_t layer);
  // The attention step's forward (a.attn, a.attn_lse from a.qkv) and backward (dqkv from
  // dattn): packed, or context-parallel with the group's collectives.
  absl::Status Attend(const LayerActivations& a);
  absl::Status AttendBackward(const LayerActivations& a, const Tensor& dattn, const Tensor& dqkv);
  // The same with Ulysses' all-to-alls over heads (model/context_heads.h).
  absl::Status AttendHeads(const LayerActivations& a);
  absl::Status AttendHeadsBackward(const LayerActivations& a, const Tensor& dattn,
                                   const Tensor& dqkv);
  absl::Status BackwardLayer(const LayerParams& p, const LayerParams& g, int64_t layer);

  ModelConfig config_;
  Device device_;
  TransformerOptions options_;
  std::vector<float> inv_freq_;  // (D/2) RoPE inverse frequencies
  Arena& workspace() const { return options_.shared_workspace ? *options_.shared_workspace : arena_; }

  mutable Arena arena_;  // unless options_.shared_workspace
  std::unique_ptr<Workspace> ws_;
};

}  // namespace prl
