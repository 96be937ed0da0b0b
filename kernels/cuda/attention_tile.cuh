// Building blocks of the FlashAttention kernels (attention_forward.cu, attention_backward.cu):
// the query/key tile map over packed sequences, asynchronous global->shared tile copies, and
// the bf16 tensor-core primitives (ldmatrix, mma.sync m16n8k16 with fp32 accumulation).
//
// Fragment layouts (PTX ISA, mma.m16n8k16, g = lane / 4, t = lane % 4):
//   A (16 x 16, row-major): a0 = (g, 2t..2t+1), a1 = (g+8, 2t..), a2 = (g, 2t+8..), a3 =
//   (g+8, 2t+8..). B (16 x 8, k x n): b0 = (k 2t..2t+1, n g), b1 = (k 2t+8.., n g).
//   C (16 x 8, fp32): c0, c1 = (g, 2t..2t+1), c2, c3 = (g+8, 2t..2t+1).
// Two adjacent C tiles (n 0..7 and 8..15) of one row block, packed to bf16, are exactly the A
// fragment of the next product's 16-wide k step (P = softmax(S) feeds P.V from registers).
//
// Shared tiles are row-major bf16 with a row stride of D + 8 elements: the 16-byte pad puts
// the 8 rows an ldmatrix phase reads in 8 different bank groups (no conflicts).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>
#include <type_traits>

#include "core/check.h"

namespace prl::kernels::cuda::flash {

constexpr int kWarps = 4;  // every FlashAttention kernel runs 4 warps (128 threads) per block
constexpr int kThreads = 32 * kWarps;

template <int kD>
inline constexpr int kSmemStride = kD + 8;

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// Calls f(std::integral_constant<int, D>{}) for the head sizes with a fused kernel.
template <typename F>
void DispatchHeadDim(int64_t D, F&& f) {
  if (D == 64) {
    f(std::integral_constant<int, 64>{});
  } else {
    PRL_CHECK(D == 128, "FlashAttention: head_dim 64 or 128, found ", D);
    f(std::integral_constant<int, 128>{});
  }
}

// --- Tile map over packed sequences ---------------------------------------------------------
// The tiles of all sequences are laid on one grid axis without a host round trip: sequence s
// owns the slots [base(s), base(s) + ceil(len_s / kTile)) with base(s) = s + cu[s] / kTile.
// base(s + 1) - base(s) = 1 + floor(cu[s+1] / kTile) - floor(cu[s] / kTile) >= ceil(len_s /
// kTile), so the ranges are disjoint, and base(B) = B + T / kTile slots cover every tile; a
// block finds its sequence by binary search over base (a device prefix search) and the few
// slots between ranges exit at once.
inline int64_t NumTileSlots(int64_t num_seqs, int64_t T, int tile) { return num_seqs + T / tile; }

struct TileSlot {
  int64_t start;  // the sequence's first token (row of qkv)
  int len;        // its length
  int tile;       // tile index within the sequence
  bool valid;
};

__device__ __forceinline__ TileSlot FindTile(const int32_t* cu, int64_t num_seqs, int64_t slot,
                                             int tile) {
  int64_t lo = 0, hi = num_seqs - 1;  // the last s with base(s) <= slot (base(0) = 0)
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (mid + cu[mid] / tile <= slot) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  TileSlot ts;
  ts.start = cu[lo];
  ts.len = cu[lo + 1] - cu[lo];
  ts.tile = static_cast<int>(slot - (lo + cu[lo] / tile));
  ts.valid = static_cast<int64_t>(ts.tile) * tile < ts.len;
  return ts;
}

// --- Asynchronous copies ---------------------------------------------------------------------
__device__ __forceinline__ uint32_t SmemAddress(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared; zero-fills instead when !valid (src must still be a valid address).
__device__ __forceinline__ void CpAsync16(void* smem, const void* gmem, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(SmemAddress(smem)),
               "l"(gmem), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void CpAsync4(void* smem, const void* gmem, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(SmemAddress(smem)), "l"(gmem),
               "r"(valid ? 4 : 0));
}
__device__ __forceinline__ void CpAsyncCommit() { asm volatile("cp.async.commit_group;\n" ::); }
// Waits until at most kPending of this thread's committed groups are still in flight.
template <int kPending>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

// Rows [row0, row0 + kRows) of one head (kD bf16 at `head`, rows `row_stride` elements apart)
// into a shared tile; rows at or beyond `len` are zero-filled, so masked keys and padded
// queries hold finite values.
template <int kRows, int kD>
__device__ __forceinline__ void LoadTile(__nv_bfloat16* smem, const __nv_bfloat16* head,
                                         int64_t row_stride, int row0, int len) {
  constexpr int kChunksPerRow = kD / 8;
  for (int c = threadIdx.x; c < kRows * kChunksPerRow; c += kThreads) {
    const int r = c / kChunksPerRow, col = (c % kChunksPerRow) * 8;
    const bool valid = row0 + r < len;
    const __nv_bfloat16* src = head + (valid ? row0 + r : 0) * row_stride + col;
    CpAsync16(smem + r * kSmemStride<kD> + col, src, valid);
  }
}

// kRows per-row F32 statistics (lse or delta of one head: `stride` floats apart), 0 beyond len.
template <int kRows>
__device__ __forceinline__ void LoadRowStats(float* smem, const float* stat, int64_t stride,
                                             int row0, int len) {
  for (int r = threadIdx.x; r < kRows; r += kThreads) {
    const bool valid = row0 + r < len;
    CpAsync4(smem + r, stat + (valid ? row0 + r : 0) * stride, valid);
  }
}

// --- Tensor-core primitives --------------------------------------------------------------------
__device__ __forceinline__ void LdMatrixX4(uint32_t (&r)[4], const __nv_bfloat16* smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(SmemAddress(smem)));
}
__device__ __forceinline__ void LdMatrixX4Trans(uint32_t (&r)[4], const __nv_bfloat16* smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(SmemAddress(smem)));
}

// c (16 x 8) += a (16 x 16) . b (16 x 8), bf16 inputs, fp32 accumulation.
__device__ __forceinline__ void Mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                    uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two floats as bf16x2, `lo` in the low half (the lower column of a fragment pair).
__device__ __forceinline__ uint32_t PackBf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  uint32_t u;
  memcpy(&u, &v, sizeof(u));
  return u;
}

// A fragment of rows [row0, row0 + 16) x columns [col0, col0 + 16) of a shared tile.
template <int kD>
__device__ __forceinline__ void LoadA(uint32_t (&a)[4], const __nv_bfloat16* tile, int row0,
                                      int col0) {
  const int lane = threadIdx.x % 32;
  LdMatrixX4(a, tile + (row0 + (lane & 7) + ((lane >> 3) & 1) * 8) * kSmemStride<kD> + col0 +
                    (lane >> 4) * 8);
}

// B fragments of two n-tiles for X . tile^T, the tile stored (n, k) row-major (keys x dims):
// n rows [n0, n0 + 16), k columns [k0, k0 + 16). b[0], b[1]: n-tile n0; b[2], b[3]: n0 + 8.
template <int kD>
__device__ __forceinline__ void LoadBT(uint32_t (&b)[4], const __nv_bfloat16* tile, int n0,
                                       int k0) {
  const int lane = threadIdx.x % 32;
  LdMatrixX4(
      b, tile + (n0 + (lane >> 4) * 8 + (lane & 7)) * kSmemStride<kD> + k0 + ((lane >> 3) & 1) * 8);
}

// B fragments of two n-tiles for X . tile, the tile stored (k, n) row-major (keys x dims):
// k rows [k0, k0 + 16), n columns [n0, n0 + 16). b[0], b[1]: n-tile n0; b[2], b[3]: n0 + 8.
template <int kD>
__device__ __forceinline__ void LoadB(uint32_t (&b)[4], const __nv_bfloat16* tile, int k0, int n0) {
  const int lane = threadIdx.x % 32;
  LdMatrixX4Trans(
      b, tile + (k0 + ((lane >> 3) & 1) * 8 + (lane & 7)) * kSmemStride<kD> + n0 + (lane >> 4) * 8);
}

// Converts 16 x (2 kN) fp32 accumulators (kN-pair C tiles) to the A fragments of k steps.
template <int kTiles>
__device__ __forceinline__ void AccumulatorsToA(uint32_t (&a)[kTiles / 2][4],
                                                const float (&c)[kTiles][4]) {
#pragma unroll
  for (int k = 0; k < kTiles / 2; ++k) {
    a[k][0] = PackBf16(c[2 * k][0], c[2 * k][1]);
    a[k][1] = PackBf16(c[2 * k][2], c[2 * k][3]);
    a[k][2] = PackBf16(c[2 * k + 1][0], c[2 * k + 1][1]);
    a[k][3] = PackBf16(c[2 * k + 1][2], c[2 * k + 1][3]);
  }
}

// Stores a 16 x kD accumulator block (rows row0 + g and row0 + g + 8) times `scale` as bf16
// into rows of `dst` (`row_stride` elements apart); rows at or beyond `len` are skipped.
template <int kD>
__device__ __forceinline__ void StoreRows(__nv_bfloat16* dst, int64_t row_stride, int row0, int len,
                                          const float (&acc)[kD / 8][4], float scale0,
                                          float scale1) {
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = row0 + g + 8 * half;
    if (row >= len) continue;
    const float s = half == 0 ? scale0 : scale1;
    __nv_bfloat16* p = dst + row * row_stride + 2 * t;
#pragma unroll
    for (int n = 0; n < kD / 8; ++n) {
      *reinterpret_cast<__nv_bfloat162*>(p + 8 * n) =
          __floats2bfloat162_rn(acc[n][2 * half] * s, acc[n][2 * half + 1] * s);
    }
  }
}

}  // namespace prl::kernels::cuda::flash
