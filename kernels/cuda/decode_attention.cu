// Decode attention over the paged KV cache for steps whose rows are single tokens (flash
// decoding), the fast order of the engine's tuned kernels (kernels/cuda/decode_attention.h).
// Two kernels, both with one CTA per (sequence, kv head g, split of the context) covering all
// G = H / KV query heads of g, so that each key row is read once:
//
// - BF16: tensor cores. The G query rows are one 16-row mma tile; each of the 4 warps streams
//   its own tiles of keys through a double-buffered shared-memory stage (cp.async) and runs
//   S = Q K^T and O += P V as mma.sync m16n8k16 under an online softmax (the FlashAttention
//   building blocks of attention_tile.cuh). The SIMT kernel below spent its time on the
//   per-key shuffles and exponentials of G heads, not on memory.
// - F32 (and the SIMT reference design): kLanesPerKey lanes split a key's D elements (16-byte
//   loads, kVec each), a warp covers 32 / kLanesPerKey keys per load with two loads in flight,
//   every lane keeps its slice of the G query rows (pre-scaled by scale * log2 e) and an
//   online-softmax state per head (m, l in log2 units, acc over its slice); the lane groups
//   are merged by shuffles, the warps in shared memory.
//
// Splits are merged by DecodeMergeKernel (one warp per output row, the splits' statistics read
// in parallel by the lanes). The summation order depends on the split count, hence on the
// grid: the batch-invariant order never uses these kernels.
#include <algorithm>
#include <cmath>
#include <type_traits>

#include "kernels/cuda/attention_tile.cuh"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/decode_attention.h"

namespace prl::kernels::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kThreads = 32 * kWarps;
constexpr int kMaxGroup = 8;              // query heads per kv head (the SIMT kernel, F32)
constexpr int kMaxGroupTensorCores = 16;  // the rows of one mma tile (BF16)
constexpr int kMaxSplits = 32;            // one lane per split in the merge
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

template <typename T>
__device__ __forceinline__ void Unpack(const uint4& raw, float* out);
template <>
__device__ __forceinline__ void Unpack<float>(const uint4& raw, float* out) {
  out[0] = __uint_as_float(raw.x);
  out[1] = __uint_as_float(raw.y);
  out[2] = __uint_as_float(raw.z);
  out[3] = __uint_as_float(raw.w);
}

template <typename T, int D>
struct DecodeShape {
  static constexpr int kVec = 16 / static_cast<int>(sizeof(T));  // elements per 16-byte load
  static constexpr int kLanesPerKey = D / kVec;
  static constexpr int kKeysPerLoad = 32 / kLanesPerKey;  // keys a warp reads per load
  static_assert(kLanesPerKey >= 1 && kLanesPerKey <= 32 && 32 % kLanesPerKey == 0);
};

// partial (T, H, splits, D + 2) of (acc..., m, l) with m in natural-log units, as the row
// kernel's; out (T, H D) when splits == 1.
template <typename T, int D>
__global__ void __launch_bounds__(kThreads)
    DecodeAttentionKernel(T* out, float* partial, const T* qkv, const T* k_cache, const T* v_cache,
                          const int32_t* tables, int64_t max_blocks, const int32_t* context_lens,
                          int H, int KV, int bs, int splits, float scale_log2) {
  using S = DecodeShape<T, D>;
  constexpr int kVec = S::kVec, kLanes = S::kLanesPerKey, kKeys = S::kKeysPerLoad;
  __shared__ float merge_m[kWarps][kMaxGroup], merge_l[kWarps][kMaxGroup];
  __shared__ float merge_acc[kWarps][kMaxGroup][D];
  const int seq = blockIdx.x, g = blockIdx.y, split = blockIdx.z;
  const int G = H / KV;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int key_slot = lane / kLanes, sub = lane % kLanes;
  const int ctx = context_lens[seq];
  const int per_split = (ctx + splits - 1) / splits;
  const int begin = split * per_split, end = min(ctx, begin + per_split);

  float q[kMaxGroup][kVec];
  const T* q_row = qkv + static_cast<int64_t>(seq) * (H + 2 * KV) * D;  // row seq: one per sequence
#pragma unroll
  for (int h = 0; h < kMaxGroup; ++h) {
    if (h < G) {
      const uint4 raw = *reinterpret_cast<const uint4*>(q_row + (g * G + h) * D + sub * kVec);
      Unpack<T>(raw, q[h]);
#pragma unroll
      for (int e = 0; e < kVec; ++e) q[h][e] *= scale_log2;
    }
  }
  float m[kMaxGroup], l[kMaxGroup], acc[kMaxGroup][kVec];
#pragma unroll
  for (int h = 0; h < kMaxGroup; ++h) {
    m[h] = -INFINITY;
    l[h] = 0.0f;
#pragma unroll
    for (int e = 0; e < kVec; ++e) acc[h][e] = 0.0f;
  }

  const int32_t* table = tables + static_cast<int64_t>(seq) * max_blocks;
  auto load = [&](int j, uint4* k, uint4* v) {
    if (j >= end) return;
    const int64_t block = table[j / bs];
    const int64_t offset = ((block * KV + g) * bs + j % bs) * D + sub * kVec;
    *k = *reinterpret_cast<const uint4*>(k_cache + offset);
    *v = *reinterpret_cast<const uint4*>(v_cache + offset);
  };
  auto consume = [&](int j, const uint4& k_raw, const uint4& v_raw) {
    float kf[kVec], vf[kVec];
    Unpack<T>(k_raw, kf);
    Unpack<T>(v_raw, vf);
    const bool valid = j < end;  // the same for the kLanes lanes of a key
#pragma unroll
    for (int h = 0; h < kMaxGroup; ++h) {
      if (h >= G) break;
      float s = 0.0f;
#pragma unroll
      for (int e = 0; e < kVec; ++e) s = fmaf(q[h][e], kf[e], s);
#pragma unroll
      for (int o = kLanes / 2; o > 0; o /= 2) s += __shfl_xor_sync(0xffffffffu, s, o);
      if (valid) {
        const float m_new = fmaxf(m[h], s);
        const float corr = exp2f(m[h] - m_new), p = exp2f(s - m_new);
        l[h] = fmaf(l[h], corr, p);
#pragma unroll
        for (int e = 0; e < kVec; ++e) acc[h][e] = fmaf(acc[h][e], corr, p * vf[e]);
        m[h] = m_new;
      }
    }
  };
  // Two loads in flight per lane: keys j and j + stride, then both consumed.
  const int stride = kWarps * kKeys;
  for (int j0 = begin + warp * kKeys; j0 < end; j0 += 2 * stride) {
    const int ja = j0 + key_slot, jb = j0 + stride + key_slot;
    uint4 ka = {}, va = {}, kb = {}, vb = {};
    load(ja, &ka, &va);
    load(jb, &kb, &vb);
    consume(ja, ka, va);
    consume(jb, kb, vb);
  }

  // Merge the warp's lane groups (lanes with the same sub), then the warps.
#pragma unroll
  for (int h = 0; h < kMaxGroup; ++h) {
    if (h >= G) break;
    float mw = m[h];
#pragma unroll
    for (int o = kLanes; o < 32; o *= 2) mw = fmaxf(mw, __shfl_xor_sync(0xffffffffu, mw, o));
    const float w = mw == -INFINITY ? 0.0f : exp2f(m[h] - mw);
    float lw = l[h] * w;
#pragma unroll
    for (int o = kLanes; o < 32; o *= 2) lw += __shfl_xor_sync(0xffffffffu, lw, o);
#pragma unroll
    for (int e = 0; e < kVec; ++e) {
      float a = acc[h][e] * w;
#pragma unroll
      for (int o = kLanes; o < 32; o *= 2) a += __shfl_xor_sync(0xffffffffu, a, o);
      if (key_slot == 0) merge_acc[warp][h][sub * kVec + e] = a;
    }
    if (lane == 0) {
      merge_m[warp][h] = mw;
      merge_l[warp][h] = lw;
    }
  }
  __syncthreads();
  for (int i = threadIdx.x; i < G * D; i += kThreads) {
    const int h = i / D, d = i % D;
    float M = -INFINITY;
    for (int w = 0; w < kWarps; ++w) M = fmaxf(M, merge_m[w][h]);
    float L = 0.0f, O = 0.0f;
    if (M != -INFINITY) {
      for (int w = 0; w < kWarps; ++w) {
        const float scale = merge_m[w][h] == -INFINITY ? 0.0f : exp2f(merge_m[w][h] - M);
        L = fmaf(merge_l[w][h], scale, L);
        O = fmaf(merge_acc[w][h][d], scale, O);
      }
    }
    const int64_t row = static_cast<int64_t>(seq) * H + g * G + h;
    if (splits == 1) {
      out[row * D + d] = FromF32<T>(O / L);
    } else {
      float* part = partial + (row * splits + split) * (D + 2);
      part[d] = O;
      if (d == 0) {
        part[D] = M == -INFINITY ? -INFINITY : M * kLn2;  // natural-log units
        part[D + 1] = L;
      }
    }
  }
}

// out (r) = the splits' partial results of row r merged; a warp per row, lane s reads split s's
// statistics (splits <= 32), every split's acc loaded independently.
template <typename T>
__global__ void DecodeMergeKernel(T* out, const float* partial, int64_t rows, int splits, int D) {
  const int64_t r = blockIdx.x * static_cast<int64_t>(kWarps) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (r >= rows) return;
  const float* part = partial + r * splits * (D + 2);
  const bool mine = lane < splits;
  const float m = mine ? part[lane * (D + 2) + D] : -INFINITY;
  const float l = mine ? part[lane * (D + 2) + D + 1] : 0.0f;
  const float M = WarpMax(m);
  const float w = l > 0.0f ? expf(m - M) : 0.0f;
  const float L = WarpSum(l * w);
  for (int d = lane; d < D; d += 32) {
    float acc = 0.0f;
#pragma unroll 4
    for (int s = 0; s < splits; ++s) {
      acc = fmaf(part[s * (D + 2) + d], __shfl_sync(0xffffffffu, w, s), acc);
    }
    out[r * D + d] = FromF32<T>(acc / L);
  }
}

// The bf16 tensor-core kernel: a CTA of 4 warps per (sequence, kv head g, split), the G query
// heads of g as the rows of one 16-row mma tile (rows G..15 zero). Each warp streams its own
// tiles of kKeys keys (warp w takes tiles w, w + 4, ...) through a private double buffer in
// shared memory, so the copy of its next tile (cp.async) overlaps this tile's products; it
// computes S = Q K^T and O += P V with mma.sync m16n8k16 (fp32 accumulation, P rounded to bf16
// as FlashAttention does) under an online softmax per row. The warps are merged through shared
// memory at the end into the output or the split's partial result, as the SIMT kernel's.
template <int D>
struct TcShape {
  static constexpr int kKeys = D == 64 ? 32 : 16;  // keys per warp tile
  static constexpr int kStride = flash::kSmemStride<D>;
  static constexpr int kTileElems = kKeys * kStride;  // one K or V tile (bf16)
  static constexpr int kWarpElems = 4 * kTileElems;   // K and V, double-buffered
  static constexpr int kSmemBytes =
      (16 * kStride + flash::kWarps * kWarpElems) * static_cast<int>(sizeof(bf16));
  // The warps' (16, D) accumulators and row statistics, merged after the key loop (the K/V
  // buffers' space is reused).
  static_assert(flash::kWarps * 16 * (D + 2) * sizeof(float) <=
                flash::kWarps * kWarpElems * sizeof(bf16));
};

template <int D>
__global__ void __launch_bounds__(flash::kThreads)
    DecodeAttentionTcKernel(bf16* __restrict__ out, float* __restrict__ partial,
                            const bf16* __restrict__ qkv, const bf16* __restrict__ k_cache,
                            const bf16* __restrict__ v_cache, const int32_t* __restrict__ tables,
                            int64_t max_blocks, const int32_t* __restrict__ context_lens, int H,
                            int KV, int bs, int splits, float scale_log2) {
  using S = TcShape<D>;
  constexpr int kKeys = S::kKeys, kStride = S::kStride, kChunks = D / 8;
  constexpr int kW = flash::kWarps;
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* sQ = reinterpret_cast<bf16*>(smem);
  bf16* kv_area = sQ + 16 * kStride;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, gq = lane / 4, t = lane % 4;
  bf16* const sK[2] = {kv_area + warp * S::kWarpElems,
                       kv_area + warp * S::kWarpElems + 2 * S::kTileElems};
  bf16* const sV[2] = {sK[0] + S::kTileElems, sK[1] + S::kTileElems};
  const int seq = blockIdx.x, g = blockIdx.y, split = blockIdx.z;
  const int G = H / KV;
  const int ctx = context_lens[seq];
  const int per_split = (ctx + splits - 1) / splits;
  const int begin = min(ctx, split * per_split), end = min(ctx, begin + per_split);
  const int num_tiles = (end - begin + kKeys - 1) / kKeys;

  // Q: rows h < G are query heads g G + h of the sequence's row, the others zero.
  const bf16* q_row = qkv + static_cast<int64_t>(seq) * (H + 2 * KV) * D + g * G * D;
  for (int c = threadIdx.x; c < 16 * kChunks; c += flash::kThreads) {
    const int r = c / kChunks, col = (c % kChunks) * 8;
    flash::CpAsync16(sQ + r * kStride + col, q_row + (r < G ? r * D + col : 0), r < G);
  }
  flash::CpAsyncCommit();
  flash::CpAsyncWait<0>();
  __syncthreads();
  uint32_t qf[D / 16][4];
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) flash::LoadA<D>(qf[kk], sQ, 0, 16 * kk);

  const int32_t* table = tables + static_cast<int64_t>(seq) * max_blocks;
  auto load_tile = [&](int tile, int buf) {
    const int key0 = begin + tile * kKeys;
    for (int c = lane; c < kKeys * kChunks; c += 32) {
      const int r = c / kChunks, col = (c % kChunks) * 8, j = key0 + r;
      const bool valid = j < end;
      const int64_t offset =
          valid ? ((static_cast<int64_t>(table[j / bs]) * KV + g) * bs + j % bs) * D + col : 0;
      flash::CpAsync16(sK[buf] + r * kStride + col, k_cache + offset, valid);
      flash::CpAsync16(sV[buf] + r * kStride + col, v_cache + offset, valid);
    }
  };

  float o[D / 8][4] = {};
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};  // log2 units; this lane's columns
  if (warp < num_tiles) load_tile(warp, 0);
  flash::CpAsyncCommit();
  for (int i = 0, tile = warp; tile < num_tiles; ++i, tile += kW) {
    const int buf = i & 1;
    if (tile + kW < num_tiles) load_tile(tile + kW, buf ^ 1);
    flash::CpAsyncCommit();
    flash::CpAsyncWait<1>();  // this tile has landed; the next may still be in flight
    __syncwarp();
    float s[kKeys / 8][4] = {};
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
#pragma unroll
      for (int p = 0; p < kKeys / 16; ++p) {
        uint32_t b[4];
        flash::LoadBT<D>(b, sK[buf], 16 * p, 16 * kk);
        flash::Mma(s[2 * p], qf[kk], b[0], b[1]);
        flash::Mma(s[2 * p + 1], qf[kk], b[2], b[3]);
      }
    }
    const int key0 = begin + tile * kKeys;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      float mx = -INFINITY;
#pragma unroll
      for (int n = 0; n < kKeys / 8; ++n) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float x = s[n][2 * half + e] * scale_log2;
          if (key0 + 8 * n + 2 * t + e >= end) x = -INFINITY;
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
      float sum = 0.0f;
#pragma unroll
      for (int n = 0; n < kKeys / 8; ++n) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float p = exp2f(s[n][2 * half + e] - m_use);
          s[n][2 * half + e] = p;
          sum += p;
        }
      }
      l[half] = l[half] * correction + sum;
#pragma unroll
      for (int n = 0; n < D / 8; ++n) {
        o[n][2 * half] *= correction;
        o[n][2 * half + 1] *= correction;
      }
    }
    uint32_t pa[kKeys / 16][4];
    flash::AccumulatorsToA<kKeys / 8>(pa, s);
#pragma unroll
    for (int jj = 0; jj < kKeys / 16; ++jj) {
#pragma unroll
      for (int q = 0; q < D / 16; ++q) {
        uint32_t b[4];
        flash::LoadB<D>(b, sV[buf], 16 * jj, 16 * q);
        flash::Mma(o[2 * q], pa[jj], b[0], b[1]);
        flash::Mma(o[2 * q + 1], pa[jj], b[2], b[3]);
      }
    }
    __syncwarp();  // the warp is done with buf before the next iteration copies into it
  }
  flash::CpAsyncWait<0>();
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    l[half] += __shfl_xor_sync(0xffffffffu, l[half], 1);
    l[half] += __shfl_xor_sync(0xffffffffu, l[half], 2);
  }

  // Merge the warps: (16, D) accumulators and row statistics through shared memory.
  __syncthreads();                                       // every warp is done with its K/V buffers
  float* merge_acc = reinterpret_cast<float*>(kv_area);  // [kW][16][D]
  float* merge_m = merge_acc + kW * 16 * D;              // [kW][16]
  float* merge_l = merge_m + kW * 16;                    // [kW][16]
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = gq + 8 * half;
    float* acc_row = merge_acc + (warp * 16 + row) * D;
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      acc_row[8 * n + 2 * t] = o[n][2 * half];
      acc_row[8 * n + 2 * t + 1] = o[n][2 * half + 1];
    }
    if (t == 0) {
      merge_m[warp * 16 + row] = m[half];
      merge_l[warp * 16 + row] = l[half];
    }
  }
  __syncthreads();
  for (int i = threadIdx.x; i < G * D; i += flash::kThreads) {
    const int h = i / D, d = i % D;
    float M = -INFINITY;
    for (int w = 0; w < kW; ++w) M = fmaxf(M, merge_m[w * 16 + h]);
    float L = 0.0f, O = 0.0f;
    if (M != -INFINITY) {
      for (int w = 0; w < kW; ++w) {
        const float mw = merge_m[w * 16 + h];
        const float scale = mw == -INFINITY ? 0.0f : exp2f(mw - M);
        L = fmaf(merge_l[w * 16 + h], scale, L);
        O = fmaf(merge_acc[(w * 16 + h) * D + d], scale, O);
      }
    }
    const int64_t row = static_cast<int64_t>(seq) * H + g * G + h;
    if (splits == 1) {
      out[row * D + d] = FromF32<bf16>(L > 0.0f ? O / L : 0.0f);
    } else {
      float* part = partial + (row * splits + split) * (D + 2);
      part[d] = O;
      if (d == 0) {
        part[D] = M == -INFINITY ? -INFINITY : M * kLn2;  // natural-log units
        part[D + 1] = L;
      }
    }
  }
}

// Splits of the context per (sequence, kv head): enough CTAs for `ctas_per_sm` per SM, each
// split at least 64 keys of the longest possible context (the grid is sized for it, so that a
// captured graph serves every context length), at most kMaxSplits.
int64_t NumSplits(int device, int64_t ctas, int64_t max_context, int64_t ctas_per_sm) {
  const int64_t want = ctas_per_sm * MultiprocessorCount(device);
  if (ctas >= want) return 1;
  return std::min<int64_t>(
      {(want + ctas - 1) / ctas, std::max<int64_t>(1, max_context / 64), kMaxSplits});
}

template <typename T, int D>
void Launch(int device, T* out, const T* qkv, const T* k_cache, const T* v_cache,
            const int32_t* tables, int64_t max_blocks, const int32_t* context_lens,
            int64_t num_seqs, int64_t H, int64_t KV, int64_t block_size, int64_t max_context) {
  const cudaStream_t stream = CurrentStream(device);
  constexpr bool kTensorCores = std::is_same_v<T, bf16>;
  // The tensor-core kernel keeps two or three CTAs resident per SM; four per SM in the grid
  // leave fewer idle SMs in the last wave.
  const int64_t splits = NumSplits(device, num_seqs * KV, max_context, kTensorCores ? 4 : 2);
  float* partial = nullptr;
  if (splits > 1) {
    partial = static_cast<float*>(
        ScratchAlloc(device, static_cast<size_t>(num_seqs * H * splits * (D + 2)) * sizeof(float)));
  }
  const float scale_log2 = kLog2e / std::sqrt(static_cast<float>(D));
  const dim3 grid(static_cast<unsigned>(num_seqs), static_cast<unsigned>(KV),
                  static_cast<unsigned>(splits));
  if constexpr (kTensorCores) {
    constexpr int kSmem = TcShape<D>::kSmemBytes;
    PRL_CUDA_CHECK(cudaFuncSetAttribute(DecodeAttentionTcKernel<D>,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
    DecodeAttentionTcKernel<D><<<grid, flash::kThreads, kSmem, stream>>>(
        out, partial, qkv, k_cache, v_cache, tables, max_blocks, context_lens, static_cast<int>(H),
        static_cast<int>(KV), static_cast<int>(block_size), static_cast<int>(splits), scale_log2);
  } else {
    DecodeAttentionKernel<T, D><<<grid, kThreads, 0, stream>>>(
        out, partial, qkv, k_cache, v_cache, tables, max_blocks, context_lens, static_cast<int>(H),
        static_cast<int>(KV), static_cast<int>(block_size), static_cast<int>(splits), scale_log2);
  }
  PRL_CUDA_CHECK(cudaGetLastError());
  if (splits > 1) {
    DecodeMergeKernel<T><<<Blocks(num_seqs * H, kWarps), kThreads, 0, stream>>>(
        out, partial, num_seqs * H, static_cast<int>(splits), static_cast<int>(D));
    PRL_CUDA_CHECK(cudaGetLastError());
    ScratchFree(device, partial);
  }
}

}  // namespace

bool DecodeAttentionSupported(DType dt, int64_t H, int64_t KV, int64_t D) {
  if (KV <= 0 || H % KV != 0 || (D != 64 && D != 128)) return false;
  if (dt == DType::kBF16) return H / KV <= kMaxGroupTensorCores;
  return dt == DType::kF32 && H / KV <= kMaxGroup;
}

void DecodeAttention(int device, DType dt, void* out, const void* qkv, const void* k_cache,
                     const void* v_cache, const int32_t* block_tables, int64_t max_blocks,
                     const int32_t* context_lens, int64_t num_seqs, int64_t H, int64_t KV,
                     int64_t D, int64_t block_size) {
  PRL_CHECK(DecodeAttentionSupported(dt, H, KV, D), "DecodeAttention: unsupported shape H=", H,
            " KV=", KV, " D=", D, " ", DTypeName(dt));
  if (num_seqs == 0) return;
  SetDevice(device);
  const int64_t max_context = max_blocks * block_size;
  DispatchDType(dt, [&](auto tag) {
    using T = decltype(tag);
    auto run = [&](auto d) {
      constexpr int kD = decltype(d)::value;
      Launch<T, kD>(device, static_cast<T*>(out), static_cast<const T*>(qkv),
                    static_cast<const T*>(k_cache), static_cast<const T*>(v_cache), block_tables,
                    max_blocks, context_lens, num_seqs, H, KV, block_size, max_context);
    };
    if (D == 64) {
      run(std::integral_constant<int, 64>{});
    } else {
      run(std::integral_constant<int, 128>{});
    }
  });
}

}  // namespace prl::kernels::cuda
