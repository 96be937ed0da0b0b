// One Llama/Qwen2 decoder layer's forward, shared by the learner (Transformer: packed causal
// attention) and the engine (ModelRunner: paged KV-cache attention). Only the attention step
// differs between them, and it is passed in; everything else — norms, projections, RoPE, MLP,
// residuals — is this one function, so the two paths cannot drift apart.
#pragma once

#include "absl/functional/function_ref.h"
#include "core/arena.h"
#include "kernels/reduction_order.h"
#include "model/config.h"
#include "model/parameters.h"

namespace prl {

// What a layer's forward computes for T tokens (and what its backward reads).
struct LayerActivations {
  Tensor input;     // (T, C) residual stream entering the layer
  Tensor ln1;       // (T, C) input_layernorm output
  Tensor ln1_rstd;  // (T)
  Tensor qkv;       // (T, QKV) projections + bias, RoPE applied to q and k
  Tensor attn;      // (T, H D) attention output, before o_proj
  Tensor attn_lse;  // (T, H) attention log-sum-exp (undefined when not kept)
  Tensor mid;       // (T, C) residual stream after attention
  Tensor ln2;       // (T, C) post_attention_layernorm output
  Tensor ln2_rstd;  // (T)
  Tensor gate_up;   // (T, 2 I)
  Tensor act;       // (T, I) silu(gate) * up
};

// Lays out one layer's activations for T tokens in an arena (Arena::Build's layout function).
// Activations are stored in `dtype` (F32, or BF16 in the CUDA bf16 mode); the norms' rstd and
// the attention lse are F32.
LayerActivations TakeLayerActivations(Arena& arena, const ModelConfig& config, int64_t T,
                                      bool with_attention_lse, DType dtype = DType::kF32);

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
};

// Fills a.attn (and a.attn_lse if kept) from a.qkv (RoPE applied, unless the context's
// attention_applies_rope leaves that to this step).
using AttentionStep = absl::FunctionRef<void(const LayerActivations& a)>;

// Runs the layer on a.input and writes the residual stream it produces to next_input
// (T, C), which must not alias a.input or a.mid.
void DecoderLayerForward(const LayerContext& ctx, const LayerParams& p, const LayerActivations& a,
                         const Tensor& next_input, AttentionStep attention);

}  // namespace prl
