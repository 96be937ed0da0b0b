// Qwen3-MoE grouped-expert kernels (kernels/cuda/moe.h). Compiled, not yet run on a GPU.
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/moe.h"

namespace prl::kernels::cuda {

bool MoeCudaKernelsEnabled() { return false; }

namespace {

constexpr int kMaxExperts = 256;
constexpr int kTile = 16;

// One thread per token: E <= 256 probabilities in registers/local memory; the top-k is K
// passes of an arg-max that skips the taken ids (the first maximum wins: ties to the lower id).
__global__ void MoeRouteKernel(float* probs, int32_t* routes, float* weights, const float* logits,
                               int64_t T, int E, int K, bool renormalise) {
  const int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (t >= T) return;
  const float* l = logits + t * E;
  float* p = probs + t * E;
  float max = l[0];
  for (int e = 1; e < E; ++e) max = fmaxf(max, l[e]);
  double sum = 0.0;
  for (int e = 0; e < E; ++e) {
    p[e] = expf(l[e] - max);
    sum += p[e];
  }
  const float inv = static_cast<float>(1.0 / sum);
  for (int e = 0; e < E; ++e) p[e] *= inv;
  unsigned taken[kMaxExperts / 32] = {};
  float kept = 0.0f;
  for (int k = 0; k < K; ++k) {
    int best = -1;
    for (int e = 0; e < E; ++e) {
      if (taken[e / 32] & (1u << (e % 32))) continue;
      if (best < 0 || p[e] > p[best]) best = e;
    }
    taken[best / 32] |= 1u << (best % 32);
    routes[t * K + k] = best;
    weights[t * K + k] = p[best];
    kept += p[best];
  }
  if (renormalise) {
    for (int k = 0; k < K; ++k) weights[t * K + k] /= kept;
  }
}

template <typename T>
__global__ void MoeGatherKernel(T* x, const T* in, const int32_t* token_of, int64_t N, int64_t C) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= N * C) return;
  const int64_t r = i / C, c = i % C;
  x[i] = in[static_cast<int64_t>(token_of[r]) * C + c];
}

// Block (kTile x kTile threads) = one (row tile, column tile) of one expert (blockIdx.z); a
// tile past the expert's rows returns at once. Each output sums Kdim in order (fp32).
template <typename T>
__global__ void MoeGroupedGemmKernel(T* out, const T* a, const T* w, const int32_t* expert_begin,
                                     int64_t Nout, int64_t Kdim) {
  __shared__ float as[kTile][kTile + 1];
  __shared__ float ws[kTile][kTile + 1];
  const int e = blockIdx.z;
  const int64_t begin = expert_begin[e], rows = expert_begin[e + 1] - begin;
  const int64_t row0 = static_cast<int64_t>(blockIdx.y) * kTile;
  if (row0 >= rows) return;
  const int64_t col0 = static_cast<int64_t>(blockIdx.x) * kTile;
  const int tr = threadIdx.y, tc = threadIdx.x;
  const T* we = w + static_cast<int64_t>(e) * Nout * Kdim;
  float acc = 0.0f;
  for (int64_t k0 = 0; k0 < Kdim; k0 += kTile) {
    const int64_t ar = row0 + tr, ak = k0 + tc, wr = col0 + tr;
    as[tr][tc] = ar < rows && ak < Kdim ? ToF32(a[(begin + ar) * Kdim + ak]) : 0.0f;
    ws[tr][tc] = wr < Nout && ak < Kdim ? ToF32(we[wr * Kdim + ak]) : 0.0f;
    __syncthreads();
#pragma unroll
    for (int k = 0; k < kTile; ++k) acc = fmaf(as[tr][k], ws[tc][k], acc);
    __syncthreads();
  }
  const int64_t r = row0 + tr, c = col0 + tc;
  if (r < rows && c < Nout) out[(begin + r) * Nout + c] = FromF32<T>(acc);
}

template <typename T>
__global__ void MoeCombineKernel(T* out, const T* residual, const T* y, const float* weights,
                                 const int32_t* row_of, int64_t Tn, int64_t K, int64_t C) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= Tn * C) return;
  const int64_t t = i / C, c = i % C;
  float acc = 0.0f;
  for (int64_t k = 0; k < K; ++k) {
    acc += weights[t * K + k] * ToF32(y[static_cast<int64_t>(row_of[t * K + k]) * C + c]);
  }
  out[i] = FromF32<T>(ToF32(residual[i]) + acc);
}

}  // namespace

void MoeRoute(int device, float* probs, int32_t* routes, float* weights, const float* logits,
              int64_t T, int64_t E, int64_t K, bool renormalise) {
  PRL_CHECK(E >= 1 && E <= kMaxExperts && K >= 1 && K <= E, "MoeRoute: E ", E, ", K ", K);
  if (T == 0) return;
  constexpr int kThreads = 128;
  MoeRouteKernel<<<Blocks(T, kThreads), kThreads, 0, CurrentStream(device)>>>(
      probs, routes, weights, logits, T, static_cast<int>(E), static_cast<int>(K), renormalise);
  PRL_CUDA_CHECK(cudaGetLastError());
}

void MoeGatherRows(int device, DType dt, void* x, const void* in, const int32_t* token_of,
                   int64_t N, int64_t C) {
  if (N * C == 0) return;
  constexpr int kThreads = 256;
  DispatchDType(dt, [&](auto zero) {
    using T = decltype(zero);
    MoeGatherKernel<T><<<Blocks(N * C, kThreads), kThreads, 0, CurrentStream(device)>>>(
        static_cast<T*>(x), static_cast<const T*>(in), token_of, N, C);
  });
  PRL_CUDA_CHECK(cudaGetLastError());
}

void MoeGroupedGemm(int device, DType dt, void* out, const void* a, const void* w,
                    const int32_t* expert_begin, int64_t E, int64_t max_rows, int64_t Nout,
                    int64_t Kdim) {
  if (E == 0 || max_rows == 0 || Nout == 0) return;
  const dim3 threads(kTile, kTile);
  const dim3 grid(static_cast<unsigned>((Nout + kTile - 1) / kTile),
                  static_cast<unsigned>((max_rows + kTile - 1) / kTile),
                  static_cast<unsigned>(E));
  DispatchDType(dt, [&](auto zero) {
    using T = decltype(zero);
    MoeGroupedGemmKernel<T><<<grid, threads, 0, CurrentStream(device)>>>(
        static_cast<T*>(out), static_cast<const T*>(a), static_cast<const T*>(w), expert_begin,
        Nout, Kdim);
  });
  PRL_CUDA_CHECK(cudaGetLastError());
}

void MoeCombine(int device, DType dt, void* out, const void* residual, const void* y,
                const float* weights, const int32_t* row_of, int64_t T, int64_t K, int64_t C) {
  if (T * C == 0) return;
  constexpr int kThreads = 256;
  DispatchDType(dt, [&](auto zero) {
    using Tp = decltype(zero);
    MoeCombineKernel<Tp><<<Blocks(T * C, kThreads), kThreads, 0, CurrentStream(device)>>>(
        static_cast<Tp*>(out), static_cast<const Tp*>(residual), static_cast<const Tp*>(y),
        weights, row_of, T, K, C);
  });
  PRL_CUDA_CHECK(cudaGetLastError());
}

}  // namespace prl::kernels::cuda
