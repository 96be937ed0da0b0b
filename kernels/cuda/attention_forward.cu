// FlashAttention-2 forward (attention_kernels.h): one block of 4 warps per (query tile of 64
// rows, query head); each warp owns 16 query rows, keeps its Q fragments and its (16, D) fp32
// output accumulator in registers and streams the key tiles 0..diagonal through shared memory.
// K_{j+1} is copied while the softmax and P.V of tile j run, V_{j+1} while S_{j+1} runs.
#include <cmath>
#include <cstdint>

#include "kernels/cuda/attention_kernels.h"
#include "kernels/cuda/attention_tile.cuh"
#include "kernels/cuda/cuda_common.cuh"

namespace prl::kernels::cuda {
namespace {

using flash::kThreads;

constexpr int kBlockM = 64;  // queries per block, 16 per warp
constexpr int kBlockN = 64;  // keys per tile; == kBlockM, so the diagonal tile is the last one

template <int kD>
constexpr int ForwardSmemBytes() {
  return (kBlockM + 2 * kBlockN) * flash::kSmemStride<kD> * static_cast<int>(sizeof(bf16));
}

template <int kD>
__global__ void __launch_bounds__(kThreads)
    FlashForwardKernel(bf16* __restrict__ out, float* __restrict__ lse,
                       const bf16* __restrict__ qkv, const int32_t* __restrict__ cu,
                       int64_t num_seqs, int64_t H, int64_t KV, float scale_log2) {
  constexpr int kStride = flash::kSmemStride<kD>;
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* sQ = reinterpret_cast<bf16*>(smem);
  bf16* sK = sQ + kBlockM * kStride;
  bf16* sV = sK + kBlockN * kStride;

  // Later tiles of a sequence see more keys: launch them first.
  const flash::TileSlot ts = flash::FindTile(cu, num_seqs, gridDim.x - 1 - blockIdx.x, kBlockM);
  if (!ts.valid) return;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int64_t h = blockIdx.y, kv = h / (H / KV), width = (H + 2 * KV) * kD;
  const bf16* q_head = qkv + ts.start * width + h * kD;
  const bf16* k_head = qkv + ts.start * width + (H + kv) * kD;
  const bf16* v_head = qkv + ts.start * width + (H + KV + kv) * kD;
  const int q0 = ts.tile * kBlockM, num_key_tiles = ts.tile + 1;
  const int row_a = q0 + warp * 16 + g;  // this thread's rows: row_a and row_a + 8

  flash::LoadTile<kBlockM, kD>(sQ, q_head, width, q0, ts.len);
  flash::LoadTile<kBlockN, kD>(sK, k_head, width, 0, ts.len);
  flash::CpAsyncCommit();
  flash::LoadTile<kBlockN, kD>(sV, v_head, width, 0, ts.len);
  flash::CpAsyncCommit();

  uint32_t qf[kD / 16][4];
  float o[kD / 8][4] = {};
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};  // running max (log2 units), sum
  for (int j = 0; j < num_key_tiles; ++j) {
    flash::CpAsyncWait<1>();  // Q and K_j have landed; V_j may still be in flight
    __syncthreads();
    if (j == 0) {
#pragma unroll
      for (int kk = 0; kk < kD / 16; ++kk) flash::LoadA<kD>(qf[kk], sQ, warp * 16, 16 * kk);
    }
    float s[kBlockN / 8][4] = {};  // S = Q K^T for the warp's 16 rows x kBlockN keys
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
#pragma unroll
      for (int p = 0; p < kBlockN / 16; ++p) {
        uint32_t b[4];
        flash::LoadBT<kD>(b, sK, 16 * p, 16 * kk);
        flash::Mma(s[2 * p], qf[kk], b[0], b[1]);
        flash::Mma(s[2 * p + 1], qf[kk], b[2], b[3]);
      }
    }
    __syncthreads();  // every warp is done with sK
    if (j + 1 < num_key_tiles) {
      flash::LoadTile<kBlockN, kD>(sK, k_head, width, (j + 1) * kBlockN, ts.len);
    }
    flash::CpAsyncCommit();

    // Online softmax in base 2; only the diagonal tile has keys after some of its queries
    // (and keys at or beyond len, which come after every valid query).
    const int key0 = j * kBlockN;
    const bool diagonal = j == num_key_tiles - 1;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = row_a + 8 * half;
      float mx = -INFINITY;
#pragma unroll
      for (int n = 0; n < kBlockN / 8; ++n) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float x = s[n][2 * half + e] * scale_log2;
          if (diagonal && key0 + 8 * n + 2 * t + e > row) x = -INFINITY;
          s[n][2 * half + e] = x;
          mx = fmaxf(mx, x);
        }
      }
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float m_new = fmaxf(m[half], mx);
      const float m_use = m_new == -INFINITY ? 0.0f : m_new;
      const float correction = exp2f(m[half] - m_use);
      m[half] = m_new;
      float sum = 0;
#pragma unroll
      for (int n = 0; n < kBlockN / 8; ++n) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float p = exp2f(s[n][2 * half + e] - m_use);
          s[n][2 * half + e] = p;
          sum += p;
        }
      }
      l[half] = l[half] * correction + sum;  // this thread's columns; summed over the quad below
#pragma unroll
      for (int n = 0; n < kD / 8; ++n) {
        o[n][2 * half] *= correction;
        o[n][2 * half + 1] *= correction;
      }
    }
    uint32_t pa[kBlockN / 16][4];
    flash::AccumulatorsToA<kBlockN / 8>(pa, s);

    flash::CpAsyncWait<1>();  // V_j has landed; K_{j+1} may still be in flight
    __syncthreads();
#pragma unroll
    for (int jj = 0; jj < kBlockN / 16; ++jj) {
#pragma unroll
      for (int q = 0; q < kD / 16; ++q) {
        uint32_t b[4];
        flash::LoadB<kD>(b, sV, 16 * jj, 16 * q);
        flash::Mma(o[2 * q], pa[jj], b[0], b[1]);
        flash::Mma(o[2 * q + 1], pa[jj], b[2], b[3]);
      }
    }
    __syncthreads();  // every warp is done with sV
    if (j + 1 < num_key_tiles) {
      flash::LoadTile<kBlockN, kD>(sV, v_head, width, (j + 1) * kBlockN, ts.len);
    }
    flash::CpAsyncCommit();
  }
  flash::CpAsyncWait<0>();

#pragma unroll
  for (int half = 0; half < 2; ++half) {
    l[half] += __shfl_xor_sync(0xffffffffu, l[half], 1);
    l[half] += __shfl_xor_sync(0xffffffffu, l[half], 2);
  }
  flash::StoreRows<kD>(out + ts.start * H * kD + h * kD, H * kD, q0 + warp * 16, ts.len, o,
                       1.0f / l[0], 1.0f / l[1]);
  if (t == 0) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = row_a + 8 * half;
      if (row < ts.len) lse[(ts.start + row) * H + h] = (m[half] + log2f(l[half])) * flash::kLn2;
    }
  }
}

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

bool FlashAttentionSupported(DType dt, int64_t D, std::initializer_list<const void*> tensors) {
  if (dt != DType::kBF16 || (D != 64 && D != 128)) return false;
  for (const void* p : tensors) {
    if (!Aligned16(p)) return false;
  }
  return true;
}

void FlashAttentionForward(int device, void* out, float* lse, const void* qkv,
                           const int32_t* cu_seqlens, int64_t num_seqs, int64_t T, int64_t H,
                           int64_t KV, int64_t D) {
  if (T == 0) return;
  SetDevice(device);
  const int64_t slots = flash::NumTileSlots(num_seqs, T, kBlockM);
  PRL_CHECK(slots <= INT32_MAX && H <= 65535, "FlashAttentionForward: grid too large (", slots,
            " tiles x ", H, " heads)");
  const float scale_log2 = flash::kLog2e / std::sqrt(static_cast<float>(D));
  flash::DispatchHeadDim(D, [&](auto head_dim) {
    constexpr int kD = decltype(head_dim)::value;
    constexpr int kSmem = ForwardSmemBytes<kD>();
    PRL_CUDA_CHECK(cudaFuncSetAttribute(FlashForwardKernel<kD>,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
    const dim3 grid(static_cast<unsigned>(slots), static_cast<unsigned>(H));
    FlashForwardKernel<kD><<<grid, kThreads, kSmem, CurrentStream(device)>>>(
        static_cast<bf16*>(out), lse, static_cast<const bf16*>(qkv), cu_seqlens, num_seqs, H, KV,
        scale_log2);
  });
  PRL_CUDA_CHECK(cudaGetLastError());
}

}  // namespace prl::kernels::cuda
