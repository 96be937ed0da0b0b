// Causal multi-head attention with grouped-query heads over a packed batch of sequences.
//
// Sequences are concatenated along the token axis; cu_seqlens (B + 1, I32, cu_seqlens[0] = 0,
// strictly increasing, cu_seqlens[B] = T) marks their boundaries. A token attends to itself and
// to earlier tokens of its own sequence only. Scores are scaled by 1/sqrt(D).
#pragma once

#include "core/tensor.h"
#include "kernels/reduction_order.h"

namespace prl::kernels {

struct AttentionShape {
  int64_t num_heads;     // H, query heads
  int64_t num_kv_heads;  // KV, key/value heads; H % KV == 0, query head h uses kv head h/(H/KV)
  int64_t head_dim;      // D
};

// qkv (T, (H + 2 KV) D): per row the H query heads, then KV key heads, then KV value heads
// (RoPE already applied to q and k). out (T, H D) =; lse (T, H) = per-row log-sum-exp of the
// scaled scores, saved for the backward.
// kBatchInvariant computes each row in a fixed order (and matches PagedAttentionForward).
void AttentionForward(const Tensor& out, const Tensor& lse, const Tensor& qkv,
                      const Tensor& cu_seqlens, const AttentionShape& shape,
                      ReductionOrder order = ReductionOrder::kFast);

// dqkv (T, (H + 2 KV) D) = gradient of the loss w.r.t. qkv, given dout (T, H D) and the
// forward's qkv, out and lse.
void AttentionBackward(const Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out,
                       const Tensor& lse, const Tensor& cu_seqlens, const AttentionShape& shape);

}  // namespace prl::kernels
