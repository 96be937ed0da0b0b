// FlashAttention-2 backward (attention_kernels.h), with P recomputed from the saved lse:
//   delta = rowsum(dout * out)                         DeltaKernel, a warp per (token, head)
//   dS = P * (dP - delta), dP = dout V^T, scale = 1/sqrt(D)
//   dQ = scale dS K                                     FlashDqKernel: per query tile and head
//   dK = scale dS^T Q, dV = P^T dout (over the group)   FlashDkvKernel: per key tile and query
//                                                       head, then DkvReduceKernel sums the group
// A separate dQ pass (recomputing S and dP, 7 tile products instead of 5) instead of fp32
// atomics: every output element is written once by one thread, so the result is deterministic
// and needs no fp32 scratch of dQ. Both kernels double-buffer the tiles they stream.
//
// dK/dV per query head: with one block per key tile and KV head looping over the group's G
// query heads, a causal sequence's first key tile ran G x (its query tiles) steps while the
// last ran G, and the grid held too few blocks to fill the GPU (issue 31's profile: 4.6x the
// forward kernel). One block per key tile and query head (the heads of a tile launched side by
// side, earlier tiles first) writes an fp32 partial (T, H, 2, D); DkvReduceKernel adds the G
// partials of each KV head in head order, so the result stays deterministic. With G = 1 the
// block writes dK/dV directly.
#include <cmath>
#include <cstdint>

#include "kernels/cuda/attention_kernels.h"
#include "kernels/cuda/attention_tile.cuh"
#include "kernels/cuda/cuda_common.cuh"

namespace prl::kernels::cuda {
namespace {

using flash::kThreads;

constexpr int kBlockM = 64;     // dQ kernel: queries per block, 16 per warp
constexpr int kBlockKeys = 64;  // dK/dV kernel: keys per block, 16 per warp

// Tiles streamed per step, smaller at D = 128 to keep the accumulators in registers.
template <int kD>
inline constexpr int kDqKeysPerStep = kD >= 128 ? 32 : 64;
template <int kD>
inline constexpr int kDkvQueriesPerStep = kD >= 128 ? 32 : 64;

template <int kD>
constexpr int DqSmemBytes() {
  return (2 * kBlockM + 4 * kDqKeysPerStep<kD>)*flash::kSmemStride<kD> *
         static_cast<int>(sizeof(bf16));
}
template <int kD>
constexpr int DkvSmemBytes() {
  return (2 * kBlockKeys + 4 * kDkvQueriesPerStep<kD>)*flash::kSmemStride<kD> *
             static_cast<int>(sizeof(bf16)) +
         4 * kDkvQueriesPerStep<kD> * static_cast<int>(sizeof(float));
}

template <int kD>
__global__ void DeltaKernel(float* __restrict__ delta, const bf16* __restrict__ dout,
                            const bf16* __restrict__ out, int64_t rows) {
  const int64_t row = blockIdx.x * static_cast<int64_t>(flash::kWarps) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  float s = 0;
#pragma unroll
  for (int d = 2 * lane; d < kD; d += 64) {
    const float2 a =
        __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(dout + row * kD + d));
    const float2 b =
        __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(out + row * kD + d));
    s += a.x * b.x + a.y * b.y;
  }
  s = WarpSum(s);
  if (lane == 0) delta[row] = s;
}

template <int kD>
__global__ void __launch_bounds__(kThreads)
    FlashDqKernel(bf16* __restrict__ dqkv, const bf16* __restrict__ dout,
                  const bf16* __restrict__ qkv, const float* __restrict__ lse,
                  const float* __restrict__ delta, const int32_t* __restrict__ cu, int64_t num_seqs,
                  int64_t H, int64_t KV, float scale, float scale_log2) {
  constexpr int kStride = flash::kSmemStride<kD>, kBlockN = kDqKeysPerStep<kD>;
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* sQ = reinterpret_cast<bf16*>(smem);
  bf16* sdO = sQ + kBlockM * kStride;
  bf16* sK = sdO + kBlockM * kStride;  // two buffers of kBlockN rows each
  bf16* sV = sK + 2 * kBlockN * kStride;
  auto buffer = [&](bf16* tiles, int buf) { return tiles + buf * kBlockN * kStride; };

  // Later query tiles see more keys: launch them first.
  const flash::TileSlot ts = flash::FindTile(cu, num_seqs, gridDim.x - 1 - blockIdx.x, kBlockM);
  if (!ts.valid) return;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int64_t h = blockIdx.y, kv = h / (H / KV), width = (H + 2 * KV) * kD;
  const bf16* k_head = qkv + ts.start * width + (H + kv) * kD;
  const bf16* v_head = qkv + ts.start * width + (H + KV + kv) * kD;
  const int q0 = ts.tile * kBlockM;
  const int num_key_tiles = (min(q0 + kBlockM, ts.len) + kBlockN - 1) / kBlockN;
  const int row_a = q0 + warp * 16 + g;  // this thread's rows: row_a and row_a + 8

  flash::LoadTile<kBlockM, kD>(sQ, qkv + ts.start * width + h * kD, width, q0, ts.len);
  flash::LoadTile<kBlockM, kD>(sdO, dout + ts.start * H * kD + h * kD, H * kD, q0, ts.len);
  flash::LoadTile<kBlockN, kD>(sK, k_head, width, 0, ts.len);
  flash::LoadTile<kBlockN, kD>(sV, v_head, width, 0, ts.len);
  flash::CpAsyncCommit();

  float lse2[2], row_delta[2];  // padded rows (beyond len) get 0: finite, never stored
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = row_a + 8 * half;
    const bool valid = row < ts.len;
    lse2[half] = valid ? lse[(ts.start + row) * H + h] * flash::kLog2e : 0.0f;
    row_delta[half] = valid ? delta[(ts.start + row) * H + h] : 0.0f;
  }

  uint32_t qf[kD / 16][4], dof[kD / 16][4];
  float dq[kD / 8][4] = {};
  for (int j = 0; j < num_key_tiles; ++j) {
    if (j + 1 < num_key_tiles) {
      const int next = (j + 1) & 1;
      flash::LoadTile<kBlockN, kD>(buffer(sK, next), k_head, width, (j + 1) * kBlockN, ts.len);
      flash::LoadTile<kBlockN, kD>(buffer(sV, next), v_head, width, (j + 1) * kBlockN, ts.len);
    }
    flash::CpAsyncCommit();
    flash::CpAsyncWait<1>();  // tile j (and Q, dout) have landed
    __syncthreads();
    if (j == 0) {
#pragma unroll
      for (int kk = 0; kk < kD / 16; ++kk) {
        flash::LoadA<kD>(qf[kk], sQ, warp * 16, 16 * kk);
        flash::LoadA<kD>(dof[kk], sdO, warp * 16, 16 * kk);
      }
    }
    const bf16* k = buffer(sK, j & 1);
    const bf16* v = buffer(sV, j & 1);
    float s[kBlockN / 8][4] = {}, dp[kBlockN / 8][4] = {};
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
#pragma unroll
      for (int p = 0; p < kBlockN / 16; ++p) {
        uint32_t b[4];
        flash::LoadBT<kD>(b, k, 16 * p, 16 * kk);
        flash::Mma(s[2 * p], qf[kk], b[0], b[1]);
        flash::Mma(s[2 * p + 1], qf[kk], b[2], b[3]);
        flash::LoadBT<kD>(b, v, 16 * p, 16 * kk);
        flash::Mma(dp[2 * p], dof[kk], b[0], b[1]);
        flash::Mma(dp[2 * p + 1], dof[kk], b[2], b[3]);
      }
    }
    const int key0 = j * kBlockN;
#pragma unroll
    for (int n = 0; n < kBlockN / 8; ++n) {
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int half = c / 2, key = key0 + 8 * n + 2 * t + c % 2;
        const float p = key > row_a + 8 * half ? 0.0f : exp2f(s[n][c] * scale_log2 - lse2[half]);
        s[n][c] = p * (dp[n][c] - row_delta[half]);  // dS
      }
    }
    uint32_t dsa[kBlockN / 16][4];
    flash::AccumulatorsToA<kBlockN / 8>(dsa, s);
#pragma unroll
    for (int jj = 0; jj < kBlockN / 16; ++jj) {
#pragma unroll
      for (int q = 0; q < kD / 16; ++q) {
        uint32_t b[4];
        flash::LoadB<kD>(b, k, 16 * jj, 16 * q);
        flash::Mma(dq[2 * q], dsa[jj], b[0], b[1]);
        flash::Mma(dq[2 * q + 1], dsa[jj], b[2], b[3]);
      }
    }
    __syncthreads();  // buffers j & 1 are refilled at step j + 1
  }
  flash::CpAsyncWait<0>();
  flash::StoreRows<kD>(dqkv + ts.start * width + h * kD, width, q0 + warp * 16, ts.len, dq, scale,
                       scale);
}

// Grid (tile slots x group, KV): block x covers key tile slot x / group and query head
// kv * group + x % group. dkv_part (T, H, 2, D) F32 receives (scale dK, dV) of that head when
// group > 1; with group == 1, dqkv's dK/dV rows are written directly.
template <int kD>
__global__ void __launch_bounds__(kThreads)
    FlashDkvKernel(bf16* __restrict__ dqkv, float* __restrict__ dkv_part,
                   const bf16* __restrict__ dout, const bf16* __restrict__ qkv,
                   const float* __restrict__ lse, const float* __restrict__ delta,
                   const int32_t* __restrict__ cu, int64_t num_seqs, int64_t H, int64_t KV,
                   float scale, float scale_log2) {
  constexpr int kStride = flash::kSmemStride<kD>, kBlockQ = kDkvQueriesPerStep<kD>;
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* sK = reinterpret_cast<bf16*>(smem);
  bf16* sV = sK + kBlockKeys * kStride;
  // Two buffers each of the streamed query tiles and their per-row statistics.
  bf16* sQ_base = sV + kBlockKeys * kStride;
  bf16* sdO_base = sQ_base + 2 * kBlockQ * kStride;
  float* sLse_base = reinterpret_cast<float*>(sdO_base + 2 * kBlockQ * kStride);
  float* sDelta_base = sLse_base + 2 * kBlockQ;
  auto sQ = [&](int buf) { return sQ_base + buf * kBlockQ * kStride; };
  auto sdO = [&](int buf) { return sdO_base + buf * kBlockQ * kStride; };
  auto sLse = [&](int buf) { return sLse_base + buf * kBlockQ; };
  auto sDelta = [&](int buf) { return sDelta_base + buf * kBlockQ; };

  // Earlier key tiles are seen by more queries: launch them first (slots in sequence order).
  const int64_t group = H / KV;
  const flash::TileSlot ts = flash::FindTile(cu, num_seqs, blockIdx.x / group, kBlockKeys);
  if (!ts.valid) return;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int64_t kv = blockIdx.y, hq = kv * group + blockIdx.x % group, width = (H + 2 * KV) * kD;
  const int k0 = ts.tile * kBlockKeys;
  const int key_a = k0 + warp * 16 + g;  // this thread's keys: key_a and key_a + 8
  // Steps: the query tiles of head hq that can see a key of this tile.
  const int first_q_tile = k0 / kBlockQ;
  const int steps = (ts.len + kBlockQ - 1) / kBlockQ - first_q_tile;
  auto load_step = [&](int step, int buf) {
    const int row0 = (first_q_tile + step) * kBlockQ;
    flash::LoadTile<kBlockQ, kD>(sQ(buf), qkv + ts.start * width + hq * kD, width, row0, ts.len);
    flash::LoadTile<kBlockQ, kD>(sdO(buf), dout + ts.start * H * kD + hq * kD, H * kD, row0,
                                 ts.len);
    flash::LoadRowStats<kBlockQ>(sLse(buf), lse + ts.start * H + hq, H, row0, ts.len);
    flash::LoadRowStats<kBlockQ>(sDelta(buf), delta + ts.start * H + hq, H, row0, ts.len);
  };

  flash::LoadTile<kBlockKeys, kD>(sK, qkv + ts.start * width + (H + kv) * kD, width, k0, ts.len);
  flash::LoadTile<kBlockKeys, kD>(sV, qkv + ts.start * width + (H + KV + kv) * kD, width, k0,
                                  ts.len);
  load_step(0, 0);
  flash::CpAsyncCommit();

  float dk[kD / 8][4] = {}, dv[kD / 8][4] = {};
  for (int step = 0; step < steps; ++step) {
    const int buf = step & 1;
    if (step + 1 < steps) load_step(step + 1, buf ^ 1);
    flash::CpAsyncCommit();
    flash::CpAsyncWait<1>();  // this step's tiles (and K, V) have landed
    __syncthreads();
    const int row0 = (first_q_tile + step) * kBlockQ;
    // S^T = K Q^T and dP^T = V dout^T: the warp's 16 keys x kBlockQ queries.
    float st[kBlockQ / 8][4] = {}, dpt[kBlockQ / 8][4] = {};
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
      uint32_t ka[4], va[4];
      flash::LoadA<kD>(ka, sK, warp * 16, 16 * kk);
      flash::LoadA<kD>(va, sV, warp * 16, 16 * kk);
#pragma unroll
      for (int p = 0; p < kBlockQ / 16; ++p) {
        uint32_t b[4];
        flash::LoadBT<kD>(b, sQ(buf), 16 * p, 16 * kk);
        flash::Mma(st[2 * p], ka, b[0], b[1]);
        flash::Mma(st[2 * p + 1], ka, b[2], b[3]);
        flash::LoadBT<kD>(b, sdO(buf), 16 * p, 16 * kk);
        flash::Mma(dpt[2 * p], va, b[0], b[1]);
        flash::Mma(dpt[2 * p + 1], va, b[2], b[3]);
      }
    }
#pragma unroll
    for (int n = 0; n < kBlockQ / 8; ++n) {
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int col = 8 * n + 2 * t + c % 2, query = row0 + col, key = key_a + 8 * (c / 2);
        const float p = key > query || query >= ts.len
                            ? 0.0f
                            : exp2f(st[n][c] * scale_log2 - sLse(buf)[col] * flash::kLog2e);
        st[n][c] = p;
        dpt[n][c] = p * (dpt[n][c] - sDelta(buf)[col]);  // dS^T
      }
    }
    uint32_t pa[kBlockQ / 16][4], dsa[kBlockQ / 16][4];
    flash::AccumulatorsToA<kBlockQ / 8>(pa, st);
    flash::AccumulatorsToA<kBlockQ / 8>(dsa, dpt);
#pragma unroll
    for (int jj = 0; jj < kBlockQ / 16; ++jj) {
#pragma unroll
      for (int q = 0; q < kD / 16; ++q) {
        uint32_t b[4];
        flash::LoadB<kD>(b, sdO(buf), 16 * jj, 16 * q);
        flash::Mma(dv[2 * q], pa[jj], b[0], b[1]);
        flash::Mma(dv[2 * q + 1], pa[jj], b[2], b[3]);
        flash::LoadB<kD>(b, sQ(buf), 16 * jj, 16 * q);
        flash::Mma(dk[2 * q], dsa[jj], b[0], b[1]);
        flash::Mma(dk[2 * q + 1], dsa[jj], b[2], b[3]);
      }
    }
    __syncthreads();  // buffer `buf` is refilled at the next step
  }
  flash::CpAsyncWait<0>();
  if (group == 1) {
    flash::StoreRows<kD>(dqkv + ts.start * width + (H + kv) * kD, width, k0 + warp * 16, ts.len, dk,
                         scale, scale);
    flash::StoreRows<kD>(dqkv + ts.start * width + (H + KV + kv) * kD, width, k0 + warp * 16,
                         ts.len, dv, 1.0f, 1.0f);
    return;
  }
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int key = key_a + 8 * half;
    if (key >= ts.len) continue;
    float* part = dkv_part + ((ts.start + key) * H + hq) * 2 * kD + 2 * t;
#pragma unroll
    for (int n = 0; n < kD / 8; ++n) {
      *reinterpret_cast<float2*>(part + 8 * n) =
          make_float2(dk[n][2 * half] * scale, dk[n][2 * half + 1] * scale);
      *reinterpret_cast<float2*>(part + kD + 8 * n) =
          make_float2(dv[n][2 * half], dv[n][2 * half + 1]);
    }
  }
}

// dqkv's dK and dV rows = the sums over each KV head's group of the per-head partials
// (T, H, 2, D), added in head order; one thread per (token, KV head, element pair).
template <int kD>
__global__ void DkvReduceKernel(bf16* __restrict__ dqkv, const float* __restrict__ dkv_part,
                                int64_t T, int64_t H, int64_t KV) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= T * KV * (kD / 2)) return;
  const int64_t token = i / (KV * (kD / 2)), kv = i / (kD / 2) % KV, d = 2 * (i % (kD / 2));
  const int64_t group = H / KV;
  float2 dk = make_float2(0.0f, 0.0f), dv = make_float2(0.0f, 0.0f);
  for (int64_t h = kv * group; h < (kv + 1) * group; ++h) {
    const float* part = dkv_part + (token * H + h) * 2 * kD + d;
    const float2 a = *reinterpret_cast<const float2*>(part);
    const float2 b = *reinterpret_cast<const float2*>(part + kD);
    dk.x += a.x;
    dk.y += a.y;
    dv.x += b.x;
    dv.y += b.y;
  }
  bf16* row = dqkv + token * (H + 2 * KV) * kD;
  *reinterpret_cast<__nv_bfloat162*>(row + (H + kv) * kD + d) = __floats2bfloat162_rn(dk.x, dk.y);
  *reinterpret_cast<__nv_bfloat162*>(row + (H + KV + kv) * kD + d) =
      __floats2bfloat162_rn(dv.x, dv.y);
}

template <typename Kernel>
void AllowSmem(Kernel kernel, int bytes) {
  PRL_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
}

}  // namespace

void FlashAttentionBackward(int device, void* dqkv, const void* dout, const void* qkv,
                            const void* out, const float* lse, const int32_t* cu_seqlens,
                            int64_t num_seqs, int64_t T, int64_t H, int64_t KV, int64_t D,
                            float* delta) {
  if (T == 0) return;
  SetDevice(device);
  const int64_t slots = flash::NumTileSlots(num_seqs, T, kBlockM);  // kBlockM == kBlockKeys
  PRL_CHECK(slots * H <= INT32_MAX && H <= 65535, "FlashAttentionBackward: grid too large (", slots,
            " tiles x ", H, " heads)");
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const float scale_log2 = scale * flash::kLog2e;
  cudaStream_t stream = CurrentStream(device);
  auto* dqkv_bf = static_cast<bf16*>(dqkv);
  const auto* dout_bf = static_cast<const bf16*>(dout);
  const auto* qkv_bf = static_cast<const bf16*>(qkv);
  flash::DispatchHeadDim(D, [&](auto head_dim) {
    constexpr int kD = decltype(head_dim)::value;
    DeltaKernel<kD><<<static_cast<unsigned>((T * H + flash::kWarps - 1) / flash::kWarps), kThreads,
                      0, stream>>>(delta, dout_bf, static_cast<const bf16*>(out), T * H);
    PRL_CUDA_CHECK(cudaGetLastError());
    AllowSmem(FlashDqKernel<kD>, DqSmemBytes<kD>());
    FlashDqKernel<kD><<<dim3(static_cast<unsigned>(slots), static_cast<unsigned>(H)), kThreads,
                        DqSmemBytes<kD>(), stream>>>(
        dqkv_bf, dout_bf, qkv_bf, lse, delta, cu_seqlens, num_seqs, H, KV, scale, scale_log2);
    PRL_CUDA_CHECK(cudaGetLastError());
    const int64_t group = H / KV;
    float* dkv_part = nullptr;
    if (group > 1) {
      dkv_part = static_cast<float*>(
          ScratchAlloc(device, static_cast<size_t>(T * H * 2 * kD) * sizeof(float)));
    }
    AllowSmem(FlashDkvKernel<kD>, DkvSmemBytes<kD>());
    FlashDkvKernel<kD><<<dim3(static_cast<unsigned>(slots * group), static_cast<unsigned>(KV)),
                         kThreads, DkvSmemBytes<kD>(), stream>>>(dqkv_bf, dkv_part, dout_bf, qkv_bf,
                                                                 lse, delta, cu_seqlens, num_seqs,
                                                                 H, KV, scale, scale_log2);
    PRL_CUDA_CHECK(cudaGetLastError());
    if (group > 1) {
      const int64_t threads = T * KV * (kD / 2);
      DkvReduceKernel<kD><<<static_cast<unsigned>((threads + 255) / 256), 256, 0, stream>>>(
          dqkv_bf, dkv_part, T, H, KV);
      PRL_CUDA_CHECK(cudaGetLastError());
      ScratchFree(device, dkv_part);
    }
  });
  PRL_CUDA_CHECK(cudaGetLastError());
}

}  // namespace prl::kernels::cuda
