// Causal GQA attention over packed sequences on the GPU (kernels/cuda/cuda_ops.h).
//
// Forward: one warp per (query token, query head); the keys of the token's own sequence up to
// itself are streamed with an online softmax in fp32; each lane owns D/32 of the head's
// dimensions (D <= 256). Backward (the FlashAttention-2 equations with P recomputed from the
// saved lse): delta = rowsum(dout * out); dQ one warp per (query, head); dK and dV one warp per
// (key, KV head), summing over the group's query heads and the later queries of its sequence —
// every output is written exactly once, with no atomics, so the backward is deterministic and
// each row's result is independent of the other sequences in the batch.
#include <cmath>

#include "kernels/cuda/cuda_common.cuh"

namespace prl::kernels::cuda {
namespace {

constexpr int kWarpsPerBlock = 4;

__device__ __forceinline__ int64_t SequenceOf(const int32_t* cu, int64_t num_seqs, int64_t t) {
  int64_t lo = 0, hi = num_seqs - 1;  // the s with cu[s] <= t < cu[s + 1]
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (cu[mid] <= t)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

template <int kPerLane, typename T>
__device__ __forceinline__ void LoadHead(float (&r)[kPerLane], const T* p, int64_t D, int lane) {
#pragma unroll
  for (int e = 0; e < kPerLane; ++e) {
    const int64_t d = lane + 32 * e;
    r[e] = d < D ? ToF32(p[d]) : 0.0f;
  }
}

template <int kPerLane>
__device__ __forceinline__ float Dot(const float (&a)[kPerLane], const float (&b)[kPerLane]) {
  float s = 0;
#pragma unroll
  for (int e = 0; e < kPerLane; ++e) s += a[e] * b[e];
  return WarpSum(s);
}

template <int kPerLane, typename T>
__global__ void ForwardKernel(T* out, float* lse, const T* qkv, const int32_t* cu, int64_t num_seqs,
                              int64_t T_, int64_t H, int64_t KV, int64_t D, float scale) {
  const int64_t row = blockIdx.x * static_cast<int64_t>(kWarpsPerBlock) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= T_ * H) return;
  const int64_t t = row / H, h = row % H, g = h / (H / KV);
  const int64_t width = (H + 2 * KV) * D;
  const int64_t start = cu[SequenceOf(cu, num_seqs, t)];
  float q[kPerLane], k[kPerLane], v[kPerLane], acc[kPerLane];
  LoadHead<kPerLane>(q, qkv + t * width + h * D, D, lane);
#pragma unroll
  for (int e = 0; e < kPerLane; ++e) acc[e] = 0;
  float m = -INFINITY, l = 0;
  for (int64_t j = start; j <= t; ++j) {
    LoadHead<kPerLane>(k, qkv + j * width + (H + g) * D, D, lane);
    const float s = Dot<kPerLane>(q, k) * scale;
    const float m_new = fmaxf(m, s);
    const float correction = expf(m - m_new), p = expf(s - m_new);
    LoadHead<kPerLane>(v, qkv + j * width + (H + KV + g) * D, D, lane);
#pragma unroll
    for (int e = 0; e < kPerLane; ++e) acc[e] = acc[e] * correction + p * v[e];
    l = l * correction + p;
    m = m_new;
  }
#pragma unroll
  for (int e = 0; e < kPerLane; ++e) {
    const int64_t d = lane + 32 * e;
    if (d < D) out[t * H * D + h * D + d] = FromF32<T>(acc[e] / l);
  }
  if (lane == 0) lse[t * H + h] = m + logf(l);
}

template <int kPerLane, typename T>
__global__ void DeltaKernel(float* delta, const T* dout, const T* out, int64_t T_, int64_t H,
                            int64_t D) {
  const int64_t row = blockIdx.x * static_cast<int64_t>(kWarpsPerBlock) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= T_ * H) return;
  float a[kPerLane], b[kPerLane];
  LoadHead<kPerLane>(a, dout + row * D, D, lane);
  LoadHead<kPerLane>(b, out + row * D, D, lane);
  const float s = Dot<kPerLane>(a, b);
  if (lane == 0) delta[row] = s;
}

template <int kPerLane, typename T>
__global__ void DqKernel(T* dqkv, const T* dout, const T* qkv, const float* lse, const float* delta,
                         const int32_t* cu, int64_t num_seqs, int64_t T_, int64_t H, int64_t KV,
                         int64_t D, float scale) {
  const int64_t row = blockIdx.x * static_cast<int64_t>(kWarpsPerBlock) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= T_ * H) return;
  const int64_t t = row / H, h = row % H, g = h / (H / KV);
  const int64_t width = (H + 2 * KV) * D;
  const int64_t start = cu[SequenceOf(cu, num_seqs, t)];
  float q[kPerLane], k[kPerLane], v[kPerLane], dout_r[kPerLane], acc[kPerLane];
  LoadHead<kPerLane>(q, qkv + t * width + h * D, D, lane);
  LoadHead<kPerLane>(dout_r, dout + row * D, D, lane);
#pragma unroll
  for (int e = 0; e < kPerLane; ++e) acc[e] = 0;
  const float lse_t = lse[row], delta_t = delta[row];
  for (int64_t j = start; j <= t; ++j) {
    LoadHead<kPerLane>(k, qkv + j * width + (H + g) * D, D, lane);
    LoadHead<kPerLane>(v, qkv + j * width + (H + KV + g) * D, D, lane);
    const float p = expf(Dot<kPerLane>(q, k) * scale - lse_t);
    const float ds = p * (Dot<kPerLane>(dout_r, v) - delta_t);
#pragma unroll
    for (int e = 0; e < kPerLane; ++e) acc[e] += ds * k[e];
  }
#pragma unroll
  for (int e = 0; e < kPerLane; ++e) {
    const int64_t d = lane + 32 * e;
    if (d < D) dqkv[t * width + h * D + d] = FromF32<T>(acc[e] * scale);
  }
}

template <int kPerLane, typename T>
__global__ void DkvKernel(T* dqkv, const T* dout, const T* qkv, const float* lse,
                          const float* delta, const int32_t* cu, int64_t num_seqs, int64_t T_,
                          int64_t H, int64_t KV, int64_t D, float scale) {
  const int64_t row = blockIdx.x * static_cast<int64_t>(kWarpsPerBlock) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= T_ * KV) return;
  const int64_t j = row / KV, g = row % KV, group = H / KV;
  const int64_t width = (H + 2 * KV) * D;
  const int64_t end = cu[SequenceOf(cu, num_seqs, j) + 1];
  float q[kPerLane], k[kPerLane], v[kPerLane], dout_r[kPerLane], dk[kPerLane], dv[kPerLane];
  LoadHead<kPerLane>(k, qkv + j * width + (H + g) * D, D, lane);
  LoadHead<kPerLane>(v, qkv + j * width + (H + KV + g) * D, D, lane);
#pragma unroll
  for (int e = 0; e < kPerLane; ++e) dk[e] = dv[e] = 0;
  for (int64_t hh = g * group; hh < (g + 1) * group; ++hh) {
    for (int64_t i = j; i < end; ++i) {
      LoadHead<kPerLane>(q, qkv + i * width + hh * D, D, lane);
      LoadHead<kPerLane>(dout_r, dout + (i * H + hh) * D, D, lane);
      const float p = expf(Dot<kPerLane>(q, k) * scale - lse[i * H + hh]);
      const float ds = p * (Dot<kPerLane>(dout_r, v) - delta[i * H + hh]);
#pragma unroll
      for (int e = 0; e < kPerLane; ++e) {
        dk[e] += ds * q[e];
        dv[e] += p * dout_r[e];
      }
    }
  }
#pragma unroll
  for (int e = 0; e < kPerLane; ++e) {
    const int64_t d = lane + 32 * e;
    if (d < D) {
      dqkv[j * width + (H + g) * D + d] = FromF32<T>(dk[e] * scale);
      dqkv[j * width + (H + KV + g) * D + d] = FromF32<T>(dv[e]);
    }
  }
}

// Calls f(std::integral_constant<int, lanes-elements>) for the head size.
template <typename F>
void DispatchHeadDim(int64_t D, F&& f) {
  PRL_CHECK(D >= 1 && D <= 256, "CUDA attention: head_dim must be in [1, 256], found ", D);
  if (D <= 32) {
    f(std::integral_constant<int, 1>{});
  } else if (D <= 64) {
    f(std::integral_constant<int, 2>{});
  } else if (D <= 128) {
    f(std::integral_constant<int, 4>{});
  } else {
    f(std::integral_constant<int, 8>{});
  }
}

int WarpBlocks(int64_t rows) {
  return static_cast<int>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock);
}

}  // namespace

void AttentionForward(int device, DType dt, void* out, float* lse, const void* qkv,
                      const int32_t* cu_seqlens, int64_t num_seqs, int64_t T, int64_t H, int64_t KV,
                      int64_t D) {
  if (T == 0) return;
  SetDevice(device);
  const float scale = 1.0f / sqrtf(static_cast<float>(D));
  DispatchDType(dt, [&](auto tag) {
    using V = decltype(tag);
    DispatchHeadDim(D, [&](auto per_lane) {
      ForwardKernel<decltype(per_lane)::value, V>
          <<<WarpBlocks(T * H), 32 * kWarpsPerBlock, 0, CurrentStream(device)>>>(
              static_cast<V*>(out), lse, static_cast<const V*>(qkv), cu_seqlens, num_seqs, T, H, KV,
              D, scale);
    });
  });
  PRL_CUDA_CHECK(cudaGetLastError());
}

void AttentionBackward(int device, DType dt, void* dqkv, const void* dout, const void* qkv,
                       const void* out, const float* lse, const int32_t* cu_seqlens,
                       int64_t num_seqs, int64_t T, int64_t H, int64_t KV, int64_t D,
                       float* scratch) {
  if (T == 0) return;
  SetDevice(device);
  const float scale = 1.0f / sqrtf(static_cast<float>(D));
  cudaStream_t stream = CurrentStream(device);
  DispatchDType(dt, [&](auto tag) {
    using V = decltype(tag);
    DispatchHeadDim(D, [&](auto per_lane) {
      constexpr int kPerLane = decltype(per_lane)::value;
      DeltaKernel<kPerLane, V><<<WarpBlocks(T * H), 32 * kWarpsPerBlock, 0, stream>>>(
          scratch, static_cast<const V*>(dout), static_cast<const V*>(out), T, H, D);
      DqKernel<kPerLane, V><<<WarpBlocks(T * H), 32 * kWarpsPerBlock, 0, stream>>>(
          static_cast<V*>(dqkv), static_cast<const V*>(dout), static_cast<const V*>(qkv), lse,
          scratch, cu_seqlens, num_seqs, T, H, KV, D, scale);
      DkvKernel<kPerLane, V><<<WarpBlocks(T * KV), 32 * kWarpsPerBlock, 0, stream>>>(
          static_cast<V*>(dqkv), static_cast<const V*>(dout), static_cast<const V*>(qkv), lse,
          scratch, cu_seqlens, num_seqs, T, H, KV, D, scale);
    });
  });
  PRL_CUDA_CHECK(cudaGetLastError());
}

}  // namespace prl::kernels::cuda
