// The RoPE rotation of one (i, i + D/2) pair, shared by RopeApply (rowwise.cu) and the engine's
// fused RoPE + KV-cache write (paged_attention.cu), so both give the same bits. The products and
// the difference are explicitly rounded: the compiler never contracts them into FMAs, whichever
// kernel inlines this.
#pragma once

#include <cstdint>

#include "kernels/cuda/cuda_common.cuh"

namespace prl::kernels::cuda {

// (x1, x2) = head[k], head[k + half] rotated by (c, s): (x1 c - x2 s, x2 c + x1 s), written back
// in T; the rotated values are returned in *r1, *r2 as stored.
template <typename T>
__device__ __forceinline__ void RotatePair(T* head, int64_t k, int64_t half, float c, float s,
                                           T* r1 = nullptr, T* r2 = nullptr) {
  const float x1 = ToF32(head[k]), x2 = ToF32(head[k + half]);
  const T y1 = FromF32<T>(__fsub_rn(__fmul_rn(x1, c), __fmul_rn(x2, s)));
  const T y2 = FromF32<T>(__fadd_rn(__fmul_rn(x2, c), __fmul_rn(x1, s)));
  head[k] = y1;
  head[k + half] = y2;
  if (r1 != nullptr) *r1 = y1;
  if (r2 != nullptr) *r2 = y2;
}

}  // namespace prl::kernels::cuda
