// The batch-invariant GEMM of the CUDA backend (ReductionOrder::kBatchInvariant): every output
// element is computed in one fixed order that depends on K only — never on M, on the tiling, or
// on how the work is split over CTAs — so a token's projections, and so its logits and
// log-probs, are bit-identical whatever else is in the batch, and between the engine (a few
// decode rows) and the learner (thousands of packed rows).
//
// The order, for out[m][n] with K split into chunks of 256:
//   P_c = fma(a[m][k], w[n][k], ...) for k in chunk c in increasing order, starting from 0
//   total = (((P_0 + P_1) + P_2) + ...)
//   v = total (+ bias[n]) ; out = (accumulate ? out + v : v), rounded to out's dtype.
// A CTA folds its chunks in that order; when a GEMM has too few output tiles to fill the GPU
// (decode: M of 1 to 64), each CTA computes one chunk's P_c into a scratch and a second kernel
// folds them — the same values in the same order, so both paths give the same bits. cuBLASLt
// picks its algorithm (and split-K) by shape, which is why the fast order cannot promise this.
//
// CUDA-core FMAs, tiles of BM x 64 outputs (BM = 16 for M <= 16, else 64), k-steps of 32
// through shared memory. It is several times slower than the tensor cores at large M; that is
// the measured price of the mode (README, prl bench engine). Experimental and off
// (SetTensorCoreInvariantGemm): BF16 products through one pinned cuBLASLt algorithm per shape
// instead (kernels/cuda/gemm.h), another fixed order, not yet verified on a GPU.
#include <algorithm>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/gemm.h"

namespace prl::kernels::cuda {
namespace {

constexpr int64_t kKChunk = 256;  // the fixed reduction chunk
constexpr int kBN = 64, kBK = 32, kThreads = 256;

template <typename OutT, typename T>
__device__ __forceinline__ void Epilogue(OutT* out, const T* bias, int64_t m, int64_t n, int64_t N,
                                         float total, bool accumulate) {
  float v = total;
  if (bias != nullptr) v = __fadd_rn(v, ToF32(bias[n]));
  if (accumulate) v = __fadd_rn(ToF32(out[m * N + n]), v);
  out[m * N + n] = FromF32<OutT>(v);
}

// partial == nullptr: fold the CTA's chunks and write out; else write each chunk's P_c to
// partial[(c * M + m) * N + n].
template <int kTM, typename T, typename OutT>
__global__ void __launch_bounds__(kThreads)
    InvariantGemmKernel(OutT* out, const T* a, const T* w, const T* bias, int64_t M, int64_t N,
                        int64_t K, bool accumulate, int64_t chunks_per_cta, float* partial) {
  constexpr int kBM = 16 * kTM;
  __shared__ float As[kBK][kBM + 1];
  __shared__ float Ws[kBK][kBN + 1];
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  const int64_t m0 = blockIdx.y * static_cast<int64_t>(kBM);
  const int64_t n0 = blockIdx.x * static_cast<int64_t>(kBN);
  const int64_t num_chunks = (K + kKChunk - 1) / kKChunk;
  const int64_t c_begin = blockIdx.z * chunks_per_cta;
  const int64_t c_end = min(num_chunks, c_begin + chunks_per_cta);
  float acc[kTM][4], total[kTM][4];
#pragma unroll
  for (int i = 0; i < kTM; ++i) {
#pragma unroll
    for (int j = 0; j < 4; ++j) total[i][j] = 0.0f;  // K = 0: the empty sum
  }
  for (int64_t c = c_begin; c < c_end; ++c) {
#pragma unroll
    for (int i = 0; i < kTM; ++i) {
#pragma unroll
      for (int j = 0; j < 4; ++j) acc[i][j] = 0.0f;
    }
    const int64_t k_end = min(K, (c + 1) * kKChunk);
    for (int64_t k0 = c * kKChunk; k0 < k_end; k0 += kBK) {
      for (int e = threadIdx.x; e < kBM * kBK; e += kThreads) {
        const int64_t m = m0 + e / kBK, k = k0 + e % kBK;
        As[e % kBK][e / kBK] = m < M && k < K ? ToF32(a[m * K + k]) : 0.0f;
      }
      for (int e = threadIdx.x; e < kBN * kBK; e += kThreads) {
        const int64_t n = n0 + e / kBK, k = k0 + e % kBK;
        Ws[e % kBK][e / kBK] = n < N && k < K ? ToF32(w[n * K + k]) : 0.0f;
      }
      __syncthreads();
#pragma unroll 8
      for (int kk = 0; kk < kBK; ++kk) {
        float av[kTM], wv[4];
#pragma unroll
        for (int i = 0; i < kTM; ++i) av[i] = As[kk][ty * kTM + i];
#pragma unroll
        for (int j = 0; j < 4; ++j) wv[j] = Ws[kk][tx * 4 + j];
#pragma unroll
        for (int i = 0; i < kTM; ++i) {
#pragma unroll
          for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(av[i], wv[j], acc[i][j]);
        }
      }
      __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < kTM; ++i) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int64_t m = m0 + ty * kTM + i, n = n0 + tx * 4 + j;
        if (partial != nullptr) {
          if (m < M && n < N) partial[(c * M + m) * N + n] = acc[i][j];
        } else {
          total[i][j] = c == c_begin ? acc[i][j] : __fadd_rn(total[i][j], acc[i][j]);
        }
      }
    }
  }
  if (partial != nullptr) return;
#pragma unroll
  for (int i = 0; i < kTM; ++i) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t m = m0 + ty * kTM + i, n = n0 + tx * 4 + j;
      if (m < M && n < N) Epilogue(out, bias, m, n, N, total[i][j], accumulate);
    }
  }
}

// Folds the chunk partials in chunk order and applies the epilogue: one thread per element.
template <typename T, typename OutT>
__global__ void FoldChunksKernel(OutT* out, const float* partial, const T* bias, int64_t M,
                                 int64_t N, int64_t num_chunks, bool accumulate) {
  const int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (e >= M * N) return;
  float total = partial[e];
  for (int64_t c = 1; c < num_chunks; ++c) total = __fadd_rn(total, partial[c * M * N + e]);
  Epilogue(out, bias, e / N, e % N, N, total, accumulate);
}

template <int kTM, typename T, typename OutT>
void Launch(int device, OutT* out, const T* a, const T* w, const T* bias, int64_t M, int64_t N,
            int64_t K, bool accumulate) {
  const cudaStream_t stream = CurrentStream(device);
  const int64_t bm = 16 * kTM, num_chunks = (K + kKChunk - 1) / kKChunk;
  const int64_t tiles = ((N + kBN - 1) / kBN) * ((M + bm - 1) / bm);
  PRL_CHECK((M + bm - 1) / bm <= 65535, "InvariantGemm: M = ", M,
            " needs more than 65535 row tiles");
  const dim3 grid_xy(static_cast<unsigned>((N + kBN - 1) / kBN),
                     static_cast<unsigned>((M + bm - 1) / bm));
  const bool split =
      num_chunks > 1 && num_chunks <= 65535 && tiles < 2 * MultiprocessorCount(device);
  if (!split) {
    InvariantGemmKernel<kTM, T, OutT><<<dim3(grid_xy.x, grid_xy.y, 1), kThreads, 0, stream>>>(
        out, a, w, bias, M, N, K, accumulate, num_chunks, nullptr);
    PRL_CUDA_CHECK(cudaGetLastError());
    return;
  }
  auto* partial = static_cast<float*>(
      ScratchAlloc(device, static_cast<size_t>(num_chunks * M * N) * sizeof(float)));
  InvariantGemmKernel<kTM, T, OutT>
      <<<dim3(grid_xy.x, grid_xy.y, static_cast<unsigned>(num_chunks)), kThreads, 0, stream>>>(
          out, a, w, bias, M, N, K, accumulate, 1, partial);
  PRL_CUDA_CHECK(cudaGetLastError());
  FoldChunksKernel<T, OutT>
      <<<Blocks(M * N, 256), 256, 0, stream>>>(out, partial, bias, M, N, num_chunks, accumulate);
  PRL_CUDA_CHECK(cudaGetLastError());
  ScratchFree(device, partial);
}

}  // namespace

void InvariantGemm(int device, DType dt, DType out_dt, void* out, const void* a, const void* w,
                   const void* bias, int64_t M, int64_t N, int64_t K, bool accumulate) {
  if (M == 0 || N == 0) return;
  PRL_CHECK(out_dt == dt || out_dt == DType::kF32, "InvariantGemm: output dtype ",
            DTypeName(out_dt), " for ", DTypeName(dt), " operands");
  SetDevice(device);
  if (TensorCoreInvariantGemm() && dt == DType::kBF16 && (bias == nullptr || out_dt == dt)) {
    // Experimental: one pinned cuBLASLt algorithm per (N, K) (kernels/cuda/gemm.h).
    GemmArgs g = LinearGemmArgs(M, N, K, a, w, out, dt, out_dt);
    g.beta = accumulate ? 1.0f : 0.0f;
    g.bias = bias;
    if (PinnedAlgorithmGemmSupported(g)) {
      return PinnedAlgorithmGemm(device, CurrentStream(device), g);
    }
  }
  DispatchDType(dt, [&](auto tag) {
    using T = decltype(tag);
    DispatchDType(out_dt, [&](auto out_tag) {
      using OutT = decltype(out_tag);
      auto* o = static_cast<OutT*>(out);
      const auto* pa = static_cast<const T*>(a);
      const auto* pw = static_cast<const T*>(w);
      const auto* pb = static_cast<const T*>(bias);
      if (M <= 16) {
        Launch<1, T, OutT>(device, o, pa, pw, pb, M, N, K, accumulate);
      } else {
        Launch<4, T, OutT>(device, o, pa, pw, pb, M, N, K, accumulate);
      }
    });
  });
}

}  // namespace prl::kernels::cuda
