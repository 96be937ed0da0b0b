// Activation checkpointing: which of a decoder layer's activations a training forward keeps
// until the backward, and which the backward computes again from them (Transformer, with
// TransformerOptions::activation_checkpointing; learner.activation_checkpointing).
//
// Per token and layer, in elements of the compute dtype (C hidden, QKV = (H + 2 KV) D, H D the
// attention output, I the MLP width; Qwen3's q/k norms add (H + KV)(D + 1); a Qwen3-MoE layer's
// MLP keeps K routed rows of 2 C + 3 Im instead of 3 I, plus E + 4 K):
//   none        every activation: input C, ln1 C, qkv QKV, attn H D (+ lse H), mid C, ln2 C,
//               gate_up 2 I, act I (+ 2 rstd)                        ~ 4 C + QKV + H D + 3 I
//   selective   the attention half's outputs: input C, qkv QKV, attn H D (+ lse H), mid C
//               (+ Qwen3's pre-norm heads); the backward recomputes the two norms and the MLP's
//               first half (gate|up projection and SwiGLU, or the MoE block) from them
//                                                                    ~ 2 C + QKV + H D
//   full        the layer's input C only; the backward recomputes the whole layer but its
//               last projection (the dense down projection: its output is the next layer's
//               input, which is kept)                                ~ C
// Both modes add one layer's worth of the parts they recompute, laid out once and shared by
// the layers (the layer being computed).
//
// Why selective recomputes the MLP and keeps attention: the MLP's activations are the large
// ones (3 I of ~ 4 C + QKV + H D + 3 I: 72% on Qwen2.5-0.5B) and cost a GEMM linear in the
// tokens to recompute; attention keeps only its output and log-sum-exp (never the T x T
// scores), and recomputing it costs the quadratic attention kernel, the most expensive step of
// a long sequence. docs/learner.md "Long sequences" has the measurement.
//
// Gradients are those of `none` bit for bit where the kernels are deterministic (the CPU): the
// recomputation runs the forward's code on the forward's inputs and parameters (under FSDP the
// backward gathers each unit anyway, before the recompute), and a Qwen3-MoE layer is recomputed
// with the experts the forward used (replayed routes included) passed as replayed routes.
#pragma once

#include "core/enum_names.h"

namespace prl {

enum class ActivationCheckpointing { kNone, kSelective, kFull };
inline constexpr NamedValue<ActivationCheckpointing> kActivationCheckpointingNames[] = {
    {"none", ActivationCheckpointing::kNone},
    {"selective", ActivationCheckpointing::kSelective},
    {"full", ActivationCheckpointing::kFull}};

// Groups of a layer's activations (LayerActivations, model/decoder_layer.h), as a bit set.
enum LayerParts : unsigned {
  kLayerInput = 1u,      // input
  kLayerAttention = 2u,  // qkv, [q_pre, k_pre, q_rstd, k_rstd,] attn, attn_lse, mid
  kLayerNorms = 4u,      // ln1, ln1_rstd, ln2, ln2_rstd
  kLayerMlp = 8u,        // gate_up and act, or the MoE block's
  kLayerAll = 15u,
};

// The parts a training forward keeps for every layer under `mode`; the others are recomputed.
inline unsigned KeptLayerParts(ActivationCheckpointing mode) {
  switch (mode) {
    case ActivationCheckpointing::kNone:
      return kLayerAll;
    case ActivationCheckpointing::kSelective:
      return kLayerInput | kLayerAttention;
    case ActivationCheckpointing::kFull:
      return kLayerInput;
  }
  return kLayerAll;
}

}  // namespace prl
