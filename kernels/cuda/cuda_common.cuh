// Shared device helpers of the CUDA backend: F32/BF16 loads and stores with fp32 arithmetic,
// dtype dispatch, warp and block reductions, launch arithmetic.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>

#include "core/check.h"
#include "core/dtype.h"
#include "kernels/cuda/cuda_ops.h"

namespace prl::kernels::cuda {

using bf16 = __nv_bfloat16;

__device__ __forceinline__ float ToF32(float x) { return x; }
__device__ __forceinline__ float ToF32(bf16 x) { return __bfloat162float(x); }
template <typename T>
__device__ __forceinline__ T FromF32(float x);
template <>
__device__ __forceinline__ float FromF32<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ bf16 FromF32<bf16>(float x) {
  return __float2bfloat16_rn(x);
}

// Calls f(T{}) with T = float for F32 and __nv_bfloat16 for BF16.
template <typename F>
void DispatchDType(DType dt, F&& f) {
  if (dt == DType::kF32) {
    f(float{});
  } else {
    PRL_CHECK(dt == DType::kBF16, "CUDA kernels take F32 or BF16 storage, found ", DTypeName(dt));
    f(bf16{});
  }
}

__device__ __forceinline__ float WarpSum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float WarpMax(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets it.
__device__ __forceinline__ float BlockSum(float v) {
  __shared__ float partial[32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  v = WarpSum(v);
  __syncthreads();  // partial may still be read by a previous call
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  const int warps = blockDim.x / 32;
  float total = 0;
  for (int i = 0; i < warps; ++i) total += partial[i];  // same order in every thread
  return total;
}

// Blocks for one thread per element (kernels without a grid-stride loop): every element gets
// its thread, or the launch is refused — never silently capped.
inline int Blocks(int64_t n, int threads) {
  const int64_t b = (n + threads - 1) / threads;
  PRL_CHECK(b <= 2147483647LL, "CUDA launch of ", n, " elements needs ", b,
            " blocks, above the grid limit");
  return static_cast<int>(b < 1 ? 1 : b);
}

// Blocks for a grid-stride loop: enough to fill the GPU, at most `cap` (the loop covers the
// rest).
inline int GridStrideBlocks(int64_t n, int threads, int64_t cap) {
  const int64_t b = (n + threads - 1) / threads;
  return static_cast<int>(b < 1 ? 1 : (b > cap ? cap : b));
}

inline void SetDevice(int device) { PRL_CUDA_CHECK(cudaSetDevice(device)); }

// Per-device caches of the kernels (attributes set, SM counts) hold this many devices.
inline constexpr int kMaxDevices = 64;

// The device's SM count (asked once per device; kernels size their grids to fill it).
inline int MultiprocessorCount(int device) {
  static std::atomic<int> counts[kMaxDevices] = {};
  PRL_CHECK(device >= 0 && device < kMaxDevices, "CUDA device ", device, " out of range");
  if (counts[device] > 0) return counts[device];
  int n = 0;
  PRL_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device));
  counts[device] = n;
  return n;
}

}  // namespace prl::kernels::cuda
