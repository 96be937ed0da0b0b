// Skinny GEMMs (kernels/cuda/gemm_skinny.h): a warp per output column n (weight row n), eight
// warps per block. Lane l reads 16-byte chunks l, l + 32, ... of the weight row (four in flight)
// and the same chunks of the M activation rows (from L1/L2: they are tiny and every warp of the
// grid reads them), accumulates M fp32 dot products, and the warp adds its lanes by shuffles;
// lane 0 applies beta C and the bias and writes the M outputs of column n.
//
// With the RMSNorm prologue (SkinnyNormGemmRun): each activation element is multiplied by the
// norm's weight as it is read, each lane also sums the squares of the activations it reads,
// and the warp scales its M dot products by rsqrt(mean square + eps) before the bias: the
// warp's lanes read every chunk of the rows once, so each warp has the whole row's sum.
#include <atomic>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/gemm_skinny.h"

namespace prl::kernels::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kUnroll = 4;  // 16-byte weight loads in flight per lane
std::atomic<bool> skinny_on{false};

__device__ __forceinline__ void Unpack8(const uint4& raw, float* out) {
  const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    out[2 * i] = __uint_as_float(words[i] << 16);
    out[2 * i + 1] = __uint_as_float(words[i] & 0xffff0000u);
  }
}

// d (M, N) = a (M, K) . w (N, K)^T [+ c (M, N)] [+ bias (N)]; T: d's, c's and bias's type.
// c may be d itself (an accumulating product): each element is read, then written, by one lane.
// kNorm: a is RMSNorm(a; g, eps) instead (c is then null).
template <int M, typename T, bool kNorm>
__global__ void __launch_bounds__(32 * kWarps)
    SkinnyGemmKernel(T* d, const bf16* __restrict__ a, const bf16* __restrict__ w, const T* c,
                     const T* __restrict__ bias, int64_t N, int64_t K,
                     const bf16* __restrict__ g, float eps) {
  const int64_t n = blockIdx.x * static_cast<int64_t>(kWarps) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (n >= N) return;
  const int64_t chunks = K / 8;
  const uint4* w_row = reinterpret_cast<const uint4*>(w + n * K);
  const uint4* a_rows = reinterpret_cast<const uint4*>(a);
  const uint4* g_row = reinterpret_cast<const uint4*>(g);
  float acc[M], squares[M];
#pragma unroll
  for (int m = 0; m < M; ++m) acc[m] = squares[m] = 0.0f;
  for (int64_t c0 = lane; c0 < chunks; c0 += 32 * kUnroll) {
    uint4 wv[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t chunk = c0 + 32 * u;
      wv[u] = chunk < chunks ? __ldg(w_row + chunk) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t chunk = c0 + 32 * u;
      if (chunk >= chunks) break;
      float wf[8];
      Unpack8(wv[u], wf);
      if constexpr (kNorm) {  // the norm's weight folded into the weight row's chunk
        float gf[8];
        Unpack8(__ldg(g_row + chunk), gf);
#pragma unroll
        for (int e = 0; e < 8; ++e) wf[e] *= gf[e];
      }
#pragma unroll
      for (int m = 0; m < M; ++m) {
        float af[8];
        Unpack8(__ldg(a_rows + m * chunks + chunk), af);
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          acc[m] = fmaf(af[e], wf[e], acc[m]);
          if constexpr (kNorm) squares[m] = fmaf(af[e], af[e], squares[m]);
        }
      }
    }
  }
#pragma unroll
  for (int m = 0; m < M; ++m) {
    acc[m] = WarpSum(acc[m]);
    if constexpr (kNorm) {
      acc[m] *= rsqrtf(WarpSum(squares[m]) / static_cast<float>(K) + eps);
    }
  }
  if (lane != 0) return;
  const float b = bias != nullptr ? ToF32(bias[n]) : 0.0f;
#pragma unroll
  for (int m = 0; m < M; ++m) {
    float v = acc[m];
    if (c != nullptr) v += ToF32(c[m * N + n]);
    d[m * N + n] = FromF32<T>(v + b);
  }
}

// norm: null, or the RMSNorm's weight (K) BF16 (then beta is 0).
template <int M, typename T>
void Launch(cudaStream_t stream, const GemmArgs& g, const void* norm, float eps) {
  const T* c = g.beta != 0 ? static_cast<const T*>(g.c != nullptr ? g.c : g.d) : nullptr;
  const unsigned blocks = static_cast<unsigned>((g.N + kWarps - 1) / kWarps);
  if (norm != nullptr) {
    SkinnyGemmKernel<M, T, true><<<blocks, 32 * kWarps, 0, stream>>>(
        static_cast<T*>(g.d), static_cast<const bf16*>(g.a), static_cast<const bf16*>(g.b),
        nullptr, static_cast<const T*>(g.bias), g.N, g.K, static_cast<const bf16*>(norm), eps);
    return;
  }
  SkinnyGemmKernel<M, T, false><<<blocks, 32 * kWarps, 0, stream>>>(
      static_cast<T*>(g.d), static_cast<const bf16*>(g.a), static_cast<const bf16*>(g.b), c,
      static_cast<const T*>(g.bias), g.N, g.K, nullptr, 0.0f);
}

template <typename T>
void LaunchRows(cudaStream_t stream, const GemmArgs& g, const void* norm, float eps) {
  switch (g.M) {
    case 1:
      return Launch<1, T>(stream, g, norm, eps);
    case 2:
      return Launch<2, T>(stream, g, norm, eps);
    case 3:
      return Launch<3, T>(stream, g, norm, eps);
    case 4:
      return Launch<4, T>(stream, g, norm, eps);
    case 5:
      return Launch<5, T>(stream, g, norm, eps);
    case 6:
      return Launch<6, T>(stream, g, norm, eps);
    case 7:
      return Launch<7, T>(stream, g, norm, eps);
    default:
      return Launch<8, T>(stream, g, norm, eps);
  }
}

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

void SetSkinnyGemm(bool on) { skinny_on.store(on, std::memory_order_relaxed); }
bool SkinnyGemm() { return skinny_on.load(std::memory_order_relaxed); }

bool SkinnyGemmSupported(const GemmArgs& g) {
  return !g.trans_a && g.trans_b && g.ab_dtype == DType::kBF16 &&
         (g.d_dtype == DType::kBF16 || g.d_dtype == DType::kF32) && g.M >= 1 &&
         g.M <= kSkinnyGemmMaxRows && g.K % 8 == 0 && g.lda == g.K && g.ldb == g.K &&
         g.ldd == g.N && g.alpha == 1.0f && (g.beta == 0.0f || g.beta == 1.0f) && Aligned16(g.a) &&
         Aligned16(g.b);
}

void SkinnyGemmRun(int device, cudaStream_t stream, const GemmArgs& g) {
  PRL_CHECK(SkinnyGemmSupported(g), "SkinnyGemmRun: unsupported shape M=", g.M, " N=", g.N,
            " K=", g.K);
  SetDevice(device);
  if (g.d_dtype == DType::kBF16) {
    LaunchRows<bf16>(stream, g, nullptr, 0.0f);
  } else {
    LaunchRows<float>(stream, g, nullptr, 0.0f);
  }
  PRL_CUDA_CHECK(cudaGetLastError());
}

bool SkinnyNormGemmSupported(const GemmArgs& g, const void* norm_weight) {
  return SkinnyGemmSupported(g) && g.beta == 0.0f && norm_weight != nullptr &&
         Aligned16(norm_weight);
}

void SkinnyNormGemmRun(int device, cudaStream_t stream, const GemmArgs& g,
                       const void* norm_weight, float eps) {
  PRL_CHECK(SkinnyNormGemmSupported(g, norm_weight),
            "SkinnyNormGemmRun: unsupported shape M=", g.M, " N=", g.N, " K=", g.K);
  SetDevice(device);
  if (g.d_dtype == DType::kBF16) {
    LaunchRows<bf16>(stream, g, norm_weight, eps);
  } else {
    LaunchRows<float>(stream, g, norm_weight, eps);
  }
  PRL_CUDA_CHECK(cudaGetLastError());
}

}  // namespace prl::kernels::cuda
