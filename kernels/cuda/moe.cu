// Qwen3-MoE's routing and row movement on CUDA (kernels/cuda/moe.h).
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/moe.h"

namespace prl::kernels::cuda {

namespace {

constexpr int kMaxExperts = 256;
constexpr int kTile = 16;

// One thread per token: E <= 256 probabilities in registers/local memory; the top-k is K
// passes of an arg-max that skips the taken ids (the first maximum wins: ties to the lower id).
// probs may alias logits: each thread reads its row's logits before writing its probabilities.
__global__ void MoeRouteKernel(float* probs, int32_t* recomputed, int32_t* routes, float* weights,
                               const float* logits, const int32_t* forced, int64_t T, int E,
                               int K, bool renormalise) {
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
  for (int k = 0; k < K; ++k) {
    int best = -1;
    for (int e = 0; e < E; ++e) {
      if (taken[e / 32] & (1u << (e % 32))) continue;
      if (best < 0 || p[e] > p[best]) best = e;
    }
    taken[best / 32] |= 1u << (best % 32);
    recomputed[t * K + k] = best;
  }
  const int32_t* use = forced != nullptr && forced[t * K] >= 0 ? forced + t * K : recomputed + t * K;
  float kept = 0.0f;
  for (int k = 0; k < K; ++k) {
    routes[t * K + k] = use[k];
    weights[t * K + k] = p[use[k]];
    kept += p[use[k]];
  }
  if (renormalise) {
    for (int k = 0; k < K; ++k) weights[t * K + k] /= kept;
  }
}

// One block of kSortThreads threads walks the pairs in chunks of kSortThreads, in order. A
// pair's row = its expert's cursor + the pairs of that expert in earlier warps of the chunk +
// those in earlier lanes of its warp (__match_any_sync), so rows keep pair order per expert.
constexpr int kSortThreads = 1024;
constexpr int kSortWarps = kSortThreads / 32;

__global__ void __launch_bounds__(kSortThreads)
    MoeSortKernel(int32_t* expert_begin, int32_t* row_of, int32_t* token_of,
                  const int32_t* routes, int64_t N, int K, int E) {
  __shared__ int32_t cursor[kMaxExperts];
  __shared__ int32_t warp_count[kSortWarps][kMaxExperts];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  for (int e = tid; e < E; e += kSortThreads) cursor[e] = 0;
  __syncthreads();
  for (int64_t i = tid; i < N; i += kSortThreads) atomicAdd(&cursor[routes[i]], 1);
  __syncthreads();
  if (tid == 0) {
    int32_t begin = 0;
    for (int e = 0; e < E; ++e) {
      const int32_t count = cursor[e];
      expert_begin[e] = begin;
      cursor[e] = begin;
      begin += count;
    }
    expert_begin[E] = begin;
  }
  for (int64_t base = 0; base < N; base += kSortThreads) {
    for (int j = tid; j < kSortWarps * E; j += kSortThreads) warp_count[j / E][j % E] = 0;
    __syncthreads();
    const int64_t i = base + tid;
    const int e = i < N ? routes[i] : -1;
    const unsigned peers = __match_any_sync(0xffffffffu, e);
    if (e >= 0 && lane == __ffs(peers) - 1) warp_count[warp][e] = __popc(peers);
    __syncthreads();
    if (e >= 0) {
      int32_t row = cursor[e] + __popc(peers & ((1u << lane) - 1u));
      for (int w = 0; w < warp; ++w) row += warp_count[w][e];
      row_of[i] = row;
      token_of[row] = static_cast<int32_t>(i / K);
    }
    __syncthreads();
    for (int x = tid; x < E; x += kSortThreads) {
      int32_t chunk = 0;
      for (int w = 0; w < kSortWarps; ++w) chunk += warp_count[w][x];
      cursor[x] += chunk;
    }
    __syncthreads();
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

// One block per (t, k) pair: dy's row and the pair's dot product, reduced in a fixed order.
constexpr int kPairThreads = 128;

template <typename T>
__global__ void MoeCombineBackwardKernel(T* dy, float* dweights, const T* dout, const T* y,
                                         const float* weights, const int32_t* row_of, int64_t K,
                                         int64_t C) {
  __shared__ double partial[kPairThreads];
  const int64_t pair = blockIdx.x, t = pair / K;
  const int64_t row = row_of[pair];
  const float w = weights[pair];
  double acc = 0.0;
  for (int64_t c = threadIdx.x; c < C; c += kPairThreads) {
    const float d = ToF32(dout[t * C + c]);
    acc += static_cast<double>(d) * ToF32(y[row * C + c]);
    dy[row * C + c] = FromF32<T>(w * d);
  }
  partial[threadIdx.x] = acc;
  __syncthreads();
  for (int stride = kPairThreads / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) partial[threadIdx.x] += partial[threadIdx.x + stride];
    __syncthreads();
  }
  if (threadIdx.x == 0) dweights[pair] = static_cast<float>(partial[0]);
}

// One thread per token (the CPU's arithmetic: model/moe_layer.h).
__global__ void MoeRouterBackwardKernel(float* dlogits, const float* probs, const int32_t* routes,
                                        const float* weights, const float* dweights,
                                        const float* aux, int64_t T, int E, int K,
                                        bool renormalise) {
  const int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (t >= T) return;
  const float* pt = probs + t * E;
  const int32_t* rt = routes + t * K;
  const float* dw = dweights + t * K;
  const float* w = weights + t * K;
  double dp[kMaxExperts];
  for (int e = 0; e < E; ++e) dp[e] = 0.0;
  if (renormalise) {
    double sum = 0.0, dw_dot_w = 0.0;
    for (int k = 0; k < K; ++k) {
      sum += pt[rt[k]];
      dw_dot_w += static_cast<double>(dw[k]) * w[k];
    }
    for (int k = 0; k < K; ++k) dp[rt[k]] = (dw[k] - dw_dot_w) / sum;
  } else {
    for (int k = 0; k < K; ++k) dp[rt[k]] = dw[k];
  }
  double p_dot_dp = 0.0;
  if (aux == nullptr) {
    for (int k = 0; k < K; ++k) p_dot_dp += pt[rt[k]] * dp[rt[k]];
  } else {
    for (int e = 0; e < E; ++e) {
      dp[e] += aux[e];
      p_dot_dp += pt[e] * dp[e];
    }
  }
  for (int e = 0; e < E; ++e) dlogits[t * E + e] = static_cast<float>(pt[e] * (dp[e] - p_dot_dp));
}

template <typename T>
__global__ void MoeScatterAddKernel(T* dx, const T* dxs, const int32_t* row_of, int64_t Tn,
                                    int64_t K, int64_t C) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= Tn * C) return;
  const int64_t t = i / C, c = i % C;
  float acc = ToF32(dx[i]);
  for (int64_t k = 0; k < K; ++k) {
    acc += ToF32(dxs[static_cast<int64_t>(row_of[t * K + k]) * C + c]);
  }
  dx[i] = FromF32<T>(acc);
}

}  // namespace

void MoeRoute(int device, float* probs, int32_t* recomputed, int32_t* routes, float* weights,
              const float* logits, const int32_t* forced, int64_t T, int64_t E, int64_t K,
              bool renormalise) {
  PRL_CHECK(E >= 1 && E <= kMaxExperts && K >= 1 && K <= E, "MoeRoute: E ", E, ", K ", K);
  if (T == 0) return;
  constexpr int kThreads = 128;
  MoeRouteKernel<<<Blocks(T, kThreads), kThreads, 0, CurrentStream(device)>>>(
      probs, recomputed, routes, weights, logits, forced, T, static_cast<int>(E),
      static_cast<int>(K), renormalise);
  PRL_CUDA_CHECK(cudaGetLastError());
}

void MoeSortByExpert(int device, int32_t* expert_begin, int32_t* row_of, int32_t* token_of,
                     const int32_t* routes, int64_t N, int64_t K, int64_t E) {
  PRL_CHECK(E >= 1 && E <= kMaxExperts && K >= 1, "MoeSortByExpert: E ", E, ", K ", K);
  MoeSortKernel<<<1, kSortThreads, 0, CurrentStream(device)>>>(
      expert_begin, row_of, token_of, routes, N, static_cast<int>(K), static_cast<int>(E));
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

void MoeCombineBackward(int device, DType dt, void* dy, float* dweights, const void* dout,
                        const void* y, const float* weights, const int32_t* row_of, int64_t T,
                        int64_t K, int64_t C) {
  if (T * K == 0) return;
  DispatchDType(dt, [&](auto zero) {
    using Tp = decltype(zero);
    MoeCombineBackwardKernel<Tp><<<static_cast<unsigned>(T * K), kPairThreads, 0,
                                   CurrentStream(device)>>>(
        static_cast<Tp*>(dy), dweights, static_cast<const Tp*>(dout), static_cast<const Tp*>(y),
        weights, row_of, K, C);
  });
  PRL_CUDA_CHECK(cudaGetLastError());
}

void MoeRouterBackward(int device, float* dlogits, const float* probs, const int32_t* routes,
                       const float* weights, const float* dweights, const float* aux_dprobs,
                       int64_t T, int64_t E, int64_t K, bool renormalise) {
  PRL_CHECK(E >= 1 && E <= kMaxExperts && K >= 1 && K <= E, "MoeRouterBackward: E ", E, ", K ",
            K);
  if (T == 0) return;
  constexpr int kThreads = 64;
  MoeRouterBackwardKernel<<<Blocks(T, kThreads), kThreads, 0, CurrentStream(device)>>>(
      dlogits, probs, routes, weights, dweights, aux_dprobs, T, static_cast<int>(E),
      static_cast<int>(K), renormalise);
  PRL_CUDA_CHECK(cudaGetLastError());
}

void MoeScatterAddRows(int device, DType dt, void* dx, const void* dxs, const int32_t* row_of,
                       int64_t T, int64_t K, int64_t C) {
  if (T * C == 0) return;
  constexpr int kThreads = 256;
  DispatchDType(dt, [&](auto zero) {
    using Tp = decltype(zero);
    MoeScatterAddKernel<Tp><<<Blocks(T * C, kThreads), kThreads, 0, CurrentStream(device)>>>(
        static_cast<Tp*>(dx), static_cast<const Tp*>(dxs), row_of, T, K, C);
  });
  PRL_CUDA_CHECK(cudaGetLastError());
}

}  // namespace prl::kernels::cuda
