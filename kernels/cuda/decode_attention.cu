// Decode attention over the paged KV cache for steps whose rows are single tokens (flash
// decoding), the fast order of the engine's tuned kernels (kernels/cuda/decode_attention.h).
//
// A CTA owns one (sequence, kv head g, split of the context) and all G = H / KV query heads
// of g. Each key row is read once, with 16-byte loads: kLanesPerKey lanes split its D elements
// (kVec each), so a warp covers 32 / kLanesPerKey keys per load and keeps two such loads in
// flight. Every lane holds its kVec-slice of the G query rows (pre-scaled by scale * log2 e)
// and, per head, an online-softmax state (m, l in log2 units, acc over its slice) for the keys
// its lane group saw. The states are merged across the lane groups of a warp by shuffles,
// across warps in shared memory, and across splits by DecodeMergeKernel (one warp per output
// row, the splits' statistics read in parallel by the lanes).
//
// Compared with the row kernel of paged_attention.cu (a lane per key, keys staged in shared
// memory as fp32, two barriers per 32 keys), the key loop here has no barrier and reads K and
// V straight into registers, so a step is bound by memory rather than by load latency. The
// summation order depends on the split count, hence on the grid: the batch-invariant order
// never uses it.
#include <algorithm>
#include <atomic>
#include <cmath>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/decode_attention.h"

namespace prl::kernels::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kThreads = 32 * kWarps;
constexpr int kMaxGroup = 8;    // query heads per kv head
constexpr int kMaxSplits = 32;  // one lane per split in the merge
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
template <>
__device__ __forceinline__ void Unpack<bf16>(const uint4& raw, float* out) {
  const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    out[2 * i] = __uint_as_float(words[i] << 16);
    out[2 * i + 1] = __uint_as_float(words[i] & 0xffff0000u);
  }
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

template <typename T, int D>
void Launch(int device, T* out, const T* qkv, const T* k_cache, const T* v_cache,
            const int32_t* tables, int64_t max_blocks, const int32_t* context_lens,
            int64_t num_seqs, int64_t H, int64_t KV, int64_t block_size, int64_t max_context) {
  const cudaStream_t stream = CurrentStream(device);
  // Enough CTAs for two per SM, each split at least 64 keys of the longest possible context
  // (the grid is sized for it, so that a captured graph serves every context length).
  const int64_t ctas = num_seqs * KV, want = 2 * MultiprocessorCount(device);
  int64_t splits = 1;
  if (ctas < want) {
    splits = std::min<int64_t>(
        {(want + ctas - 1) / ctas, std::max<int64_t>(1, max_context / 64), kMaxSplits});
  }
  float* partial = nullptr;
  if (splits > 1) {
    partial = static_cast<float*>(
        ScratchAlloc(device, static_cast<size_t>(num_seqs * H * splits * (D + 2)) * sizeof(float)));
  }
  const float scale_log2 = kLog2e / std::sqrt(static_cast<float>(D));
  const dim3 grid(static_cast<unsigned>(num_seqs), static_cast<unsigned>(KV),
                  static_cast<unsigned>(splits));
  DecodeAttentionKernel<T, D><<<grid, kThreads, 0, stream>>>(
      out, partial, qkv, k_cache, v_cache, tables, max_blocks, context_lens, static_cast<int>(H),
      static_cast<int>(KV), static_cast<int>(block_size), static_cast<int>(splits), scale_log2);
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
  if (KV <= 0 || H % KV != 0 || H / KV > kMaxGroup) return false;
  if (dt == DType::kBF16) return D == 64 || D == 128;
  return dt == DType::kF32 && (D == 64 || D == 128);
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
