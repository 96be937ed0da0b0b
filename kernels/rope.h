// Rotary position embedding (RoPE), Hugging Face rotate_half convention: within each head of
// size D, element i pairs with element i + D/2 and the pair is rotated by position * inv_freq[i].
//
// Dtypes: cos, sin and inv_freq are F32 and positions I32 on every backend; x is F32 on the
// CPU and F32 or BF16 on CUDA (rotated in fp32).
#pragma once

#include "core/tensor.h"

namespace prl::kernels {

// cos, sin (T, D/2) for the given positions (T, I32) and inverse frequencies (D/2). Angles are
// fp32 products position * inv_freq, as transformers computes them.
void RopeTables(const Tensor& cos, const Tensor& sin, const Tensor& positions,
                const Tensor& inv_freq);

// Rotates, in place, the first `num_heads` heads (of size head_dim) of every row of
// x (T, W) with W >= num_heads * head_dim. For the packed qkv activation, num_heads = H + KV
// rotates q and k and leaves v alone. inverse = true applies the transpose rotation, which is
// the backward pass.
void RopeApply(const Tensor& x, int64_t num_heads, int64_t head_dim, const Tensor& cos,
               const Tensor& sin, bool inverse);

}  // namespace prl::kernels
