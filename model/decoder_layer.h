// One Llama/Qwen2/Qwen3 decoder layer's forward, shared by the learner (Transformer: packed
// causal attention) and the engine (ModelRunner: paged KV-cache attention). Only the attention
// step differs between them, and it is passed in; everything else — norms, projections,
// Qwen3's per-head q/k norms, RoPE, MLP, residuals — is this one function, so the two paths
// cannot drift apart (and the engine caches keys after their norm and RoPE, as transformers).
#pragma once

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/types/span.h"
#include "core/arena.h"
#include "kernels/reduction_order.h"
#include "model/activation_checkpointing.h"
#include "model/config.h"
#include "model/lora_layer.h"
#include "model/moe_layer.h"
#include "model/parameters.h"

namespace prl {

// What a layer's forward computes for T tokens (and what its backward reads).
struct LayerActivations {
  Tensor input;     // (T, C) residual stream entering the layer
  Tensor ln1;       // (T, C) input_layernorm output
  Tensor ln1_rstd;  // (T)
  Tensor qkv;       // (T, QKV) projections + bias, [q/k norm,] RoPE applied to q and k
  // Qwen3 (config.qk_norm) only, else undefined: the query and key heads before their RMSNorm,
  // and its rstd per (token, head).
  Tensor q_pre;     // (T, H D)
  Tensor k_pre;     // (T, KV D)
  Tensor q_rstd;    // (T H) F32
  Tensor k_rstd;    // (T KV) F32
  Tensor attn;      // (T, H D) attention output, before o_proj
  Tensor attn_lse;  // (T, H) attention log-sum-exp (undefined when not kept)
  Tensor mid;       // (T, C) residual stream after attention
  Tensor ln2;       // (T, C) post_attention_layernorm output
  Tensor ln2_rstd;  // (T)
  Tensor gate_up;   // (T, 2 I) dense MLP (laid out iff the model has a dense-MLP layer)
  Tensor act;       // (T, I) silu(gate) * up
  MoeActivations moe;  // a MoE layer's MLP (laid out iff the model has a MoE layer)
};

// Lays out one layer's activations for T tokens in an arena (Arena::Build's layout function):
// the groups of `parts` (model/activation_checkpointing.h), the others left undefined.
// Activations are stored in `dtype` (F32, or BF16 in the CUDA bf16 mode); the norms' rstd and
// the attention lse are F32.
LayerActivations TakeLayerActivations(Arena& arena, const ModelConfig& config, int64_t T,
                                      bool with_attention_lse, DType dtype = DType::kF32,
                                      unsigned parts = kLayerAll);
// Each tensor `kept` defines, else `work`'s: a checkpointed layer's kept activations completed
// by the recomputed ones.
LayerActivations OverlayLayerActivations(const LayerActivations& kept,
                                         const LayerActivations& work);

struct LayerContext {
  const ModelConfig* config;
  Tensor rope_cos;  // (T, D/2)
  Tensor rope_sin;  // (T, D/2)
  kernels::ReductionOrder order = kernels::ReductionOrder::kFast;
  // The residual adds read the residual as the projection's C operand instead of copying it
  // first (kernels::MatmulResidualForward); the same sums, two fewer passes per layer.
  bool residual_in_gemm = false;
  // The attention step rotates q and k itself (the engine's fused RoPE + KV-cache write).
  bool attention_applies_rope = false;
  // The input and post-attention RMSNorms fused into the QKV and gate|up projections of steps of
  // at most kernels::kNormInGemmMaxRows rows where kernels::NormMatmulSupported
  // (kernels/norm_matmul.h: a CUDA BF16 decode step); a.ln1 and a.ln2 are then not written. Only
  // for passes that never read them (not the learner's).
  bool norm_in_gemm = false;
  // A MoE layer's replayed routes, (T, K) host I32 (MoeForward's forced_routes); null routes
  // every token by the router.
  const int32_t* moe_forced_routes = nullptr;
  // The layer's LoRA adapters (model/lora_layer.h) and their scale and scratch, or null. They
  // read a.ln1 and a.ln2, so norm_in_gemm must be off.
  const LoraLayerParams* lora = nullptr;
  double lora_scale = 0.0;
  const LoraScratch* lora_scratch = nullptr;
  // Instead of `lora`: several adapters, each on its rows (LoraForwardRows; the scratch too).
  absl::Span<const LoraRows> lora_rows;
  // Or several adapters, each on its segment of the rows (the learner's pass over several
  // adapters' micro-batches; the scratch too).
  absl::Span<const LoraLayerSegment> lora_segments;
};

// Fills a.attn (and a.attn_lse if kept) from a.qkv (RoPE applied, unless the context's
// attention_applies_rope leaves that to this step).
using AttentionStep = absl::FunctionRef<void(const LayerActivations& a)>;

// Runs the layer on a.input and writes the residual stream it produces to next_input
// (T, C), which must not alias a.input or a.mid: DecoderAttentionForward, then
// DecoderMlpForward.
void DecoderLayerForward(const LayerContext& ctx, const LayerParams& p, const LayerActivations& a,
                         const Tensor& next_input, AttentionStep attention);
// The attention half: a.input -> ln1, qkv (and Qwen3's pre-norm heads), attn, mid.
void DecoderAttentionForward(const LayerContext& ctx, const LayerParams& p,
                             const LayerActivations& a, AttentionStep attention);
// The MLP half: a.mid -> ln2, gate_up and act (or the MoE block's), next_input. An undefined
// next_input (a recomputation for the backward, which reads the rest only) skips a dense
// MLP's down projection; a MoE block's combine needs somewhere to write.
void DecoderMlpForward(const LayerContext& ctx, const LayerParams& p, const LayerActivations& a,
                       const Tensor& next_input);

// Qwen3's per-head q/k RMSNorm, the backward: dqkv (T, QKV) holds the gradient with respect to
// the normalised query and key heads (RoPE already undone) and receives, in their place, the
// gradient with respect to the heads before the norm; g.q_norm and g.k_norm (D) +=. scratch
// holds at least 2 T H D elements of a's dtype. The v columns are left alone.
absl::Status QkNormBackward(const ModelConfig& config, const LayerParams& p, const LayerParams& g,
                            const LayerActivations& a, const Tensor& dqkv, const Tensor& scratch);

}  // namespace prl
