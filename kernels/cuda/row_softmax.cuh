// The row log-sum-exp shared by every CUDA kernel whose log-probs must agree bit for bit: the
// learner's LM-head log-prob (logprob.cu) and the engine's sampler (sampling.cu). Both run it
// in blocks of exactly kRowThreads threads over an F32 logits row, so for equal logits they
// compute equal z = logit * inv_temperature, max, sum and lse — whatever the batch. The
// arithmetic uses explicitly rounded intrinsics (__fmul_rn, __fsub_rn, __fadd_rn), which the
// compiler never contracts into FMAs, so the result cannot depend on how a kernel inlines it.
#pragma once

#include <cstdint>

#include "kernels/cuda/cuda_common.cuh"

namespace prl::kernels::cuda {

// Threads per row of the row-wise log-softmax kernels (the reduction order depends on it).
inline constexpr int kRowThreads = 256;

// Maximum over the block (blockDim.x a multiple of 32); every thread gets it.
__device__ __forceinline__ float BlockMax(float v) {
  __shared__ float partial[32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  v = WarpMax(v);
  __syncthreads();
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  float m = -INFINITY;
  for (int i = 0; i < static_cast<int>(blockDim.x / 32); ++i) m = fmaxf(m, partial[i]);
  return m;
}

// z = logit * inv_temperature, as every log-softmax kernel scales a logit.
__device__ __forceinline__ float ScaledLogit(float logit, float inv_temperature) {
  return __fmul_rn(logit, inv_temperature);
}

struct RowLse {
  float max;  // max_v z_v
  float sum;  // sum_v exp(z_v - max)
  float lse;  // max + log(sum)
};

// log-sum-exp of z over a row of V logits. Call from all kRowThreads threads of a block (each
// gets the result); thread t reads v = t, t + kRowThreads, ...
__device__ __forceinline__ RowLse RowLogSumExp(const float* row, int64_t V, float inv_temperature) {
  float m = -INFINITY;
  for (int64_t v = threadIdx.x; v < V; v += kRowThreads) {
    m = fmaxf(m, ScaledLogit(row[v], inv_temperature));
  }
  m = BlockMax(m);
  float s = 0.0f;
  for (int64_t v = threadIdx.x; v < V; v += kRowThreads) {
    s = __fadd_rn(s, expf(__fsub_rn(ScaledLogit(row[v], inv_temperature), m)));
  }
  s = BlockSum(s);
  return {m, s, __fadd_rn(m, logf(s))};
}

// log softmax(z)[token], given the row's RowLse.
__device__ __forceinline__ float TokenLogprob(const float* row, int64_t token,
                                              float inv_temperature, const RowLse& r) {
  return __fsub_rn(ScaledLogit(row[token], inv_temperature), r.lse);
}

}  // namespace prl::kernels::cuda
