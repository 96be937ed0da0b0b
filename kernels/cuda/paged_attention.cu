// The engine's paged KV cache on the GPU (kernels/paged_attention.h): writing new K/V into their
// slots, copying blocks, and causal attention of a step's query rows over each sequence's cached
// context — plus the learner's batch-invariant attention over packed sequences, which runs the
// very same row computation so the two agree bit for bit.
//
// Cache layout on CUDA: k_cache and v_cache are both (num_blocks, KV, block_size, D) in the
// activations' dtype (BF16 in production, F32 in the exact mode), so one key or value row is D
// contiguous elements, read by a warp along d. (The CPU keeps keys transposed within a block.)
//
// The row kernel. A CTA owns one tile — up to R consecutive query rows of one sequence (R = 1
// for decode) — and one KV head g; its items are the tile's rows times the G = H / KV query
// heads of g (GQA: the K/V chunk is staged in shared memory once for all G heads, never
// repeated in memory). Keys are processed in chunks of 32 aligned at position 0, a warp per
// item and a lane per key:
//   s_j = scale * (q[0] k_j[0] + q[1] k_j[1] + ...)        an FMA chain in d order
//   m' = max(m, max_j s_j); c = exp(m - m'); p_j = exp(s_j - m')
//   l = l c + sum_j p_j (xor butterfly); acc[d] = acc[d] c + p_0 v_0[d] + p_1 v_1[d] + ...
// with explicitly rounded intrinsics, so each row's result is a function of its q and its
// visible keys only — not of the tile, the batch, the chunking of a prefill, or whether the
// keys come from the paged cache or from packed qkv rows. That is the batch-invariant order;
// it runs with one split. The fast order may split a row's chunks over several CTAs (flash
// decoding: at small batch a decode step has too few rows to fill the GPU), evenly over the
// tile's actual context, and merges the partial (m, l, acc) with a second kernel.
//
// Tiles are planned on the device from q_start (a one-block scan), so there is no host round
// trip and the launch is capturable in a CUDA graph; scratch comes from the stream-ordered
// pool (ScratchAlloc), which graph capture also records. A step of single-token rows skips the
// plan (tile b is sequence b), and in the fast order goes to decode_attention.cu.
#include <atomic>
#include <cmath>
#include <cub/block/block_scan.cuh>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/decode_attention.h"
#include "kernels/cuda/rope_rotate.cuh"

namespace prl::kernels::cuda {
namespace {

constexpr int kChunk = 32;     // keys per chunk: one per lane
constexpr int kWarps = 8;      // warps per CTA
constexpr int kMaxItems = 32;  // (row, head) items per CTA: kWarps x kItemsPerWarp
constexpr int kItemsPerWarp = kMaxItems / kWarps;
constexpr int kThreads = kWarps * 32;
constexpr int kPlanThreads = 1024;

// --- KV writes and block copies ---------------------------------------------------------

template <typename T>
__global__ void KvWriteKernel(T* k_cache, T* v_cache, const T* qkv, const int32_t* slots,
                              int64_t T_, int64_t H, int64_t KV, int64_t D, int64_t bs) {
  const int64_t per_token = KV * D;
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= T_ * per_token) return;
  const int64_t t = i / per_token, g = (i % per_token) / D, d = i % D;
  const int32_t slot = slots[t];
  if (slot < 0) return;
  const int64_t block = slot / bs, offset = slot % bs;
  const int64_t dst = ((block * KV + g) * bs + offset) * D + d;
  const T* row = qkv + t * (H + 2 * KV) * D;
  k_cache[dst] = row[(H + g) * D + d];
  v_cache[dst] = row[(H + KV + g) * D + d];
}

// RopeApply of q and k, then KvWriteKernel's writes: a thread per (token, head, pair k) of
// the H query, KV key and KV value heads; it rotates its pair of a q or k head in place (the
// shared RotatePair) and stores a k or v pair to the token's slot.
template <typename T>
__global__ void RopeKvWriteKernel(T* k_cache, T* v_cache, T* qkv, const int32_t* slots,
                                  const float* cos_t, const float* sin_t, int64_t T_, int64_t H,
                                  int64_t KV, int64_t D, int64_t bs) {
  const int64_t half = D / 2, heads = H + 2 * KV;
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= T_ * heads * half) return;
  const int64_t k = i % half, h = (i / half) % heads, t = i / (half * heads);
  T* head = qkv + (t * heads + h) * D;
  const int32_t slot = slots[t];
  T y1, y2;
  if (h < H + KV) {
    RotatePair(head, k, half, cos_t[t * half + k], sin_t[t * half + k], &y1, &y2);
    if (h < H) return;  // a query head stays in qkv
  } else {
    y1 = head[k];
    y2 = head[k + half];
  }
  if (slot < 0) return;
  const int64_t g = h < H + KV ? h - H : h - H - KV;
  const int64_t dst = ((slot / bs * KV + g) * bs + slot % bs) * D;
  T* cache = h < H + KV ? k_cache : v_cache;
  cache[dst + k] = y1;
  cache[dst + k + half] = y2;
}

__global__ void CopyBlocksKernel(uint4* k_cache, uint4* v_cache, const int32_t* pairs,
                                 int64_t block_vecs) {
  const int64_t src = pairs[2 * blockIdx.y] * block_vecs,
                dst = pairs[2 * blockIdx.y + 1] * block_vecs;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < block_vecs;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    k_cache[dst + i] = k_cache[src + i];
    v_cache[dst + i] = v_cache[src + i];
  }
}

// --- Tile planning ----------------------------------------------------------------------

// plan[2 i], plan[2 i + 1] = (sequence, first row) of tile i; *num_tiles = the tile count.
// Tiles never cross a sequence boundary: sequence b has ceil(q_len_b / R) of them.
__global__ void PlanTilesKernel(int32_t* plan, int32_t* num_tiles, const int32_t* q_start,
                                int64_t num_seqs, int32_t rows_per_tile) {
  using Scan = cub::BlockScan<int32_t, kPlanThreads>;
  __shared__ typename Scan::TempStorage scan;
  __shared__ int32_t carry;
  if (threadIdx.x == 0) carry = 0;
  __syncthreads();
  for (int64_t b0 = 0; b0 < num_seqs; b0 += kPlanThreads) {
    const int64_t b = b0 + threadIdx.x;
    const int32_t q_len = b < num_seqs ? q_start[b + 1] - q_start[b] : 0;
    const int32_t tiles = (q_len + rows_per_tile - 1) / rows_per_tile;
    int32_t before, total;
    Scan(scan).ExclusiveSum(tiles, before, total);
    before += carry;
    for (int32_t k = 0; k < tiles; ++k) {
      plan[2 * (before + k)] = static_cast<int32_t>(b);
      plan[2 * (before + k) + 1] = k * rows_per_tile;
    }
    __syncthreads();  // everyone has read carry
    if (threadIdx.x == 0) carry += total;
    __syncthreads();
  }
  if (threadIdx.x == 0) *num_tiles = carry;
}

// --- Key sources ------------------------------------------------------------------------

// Keys and values of the paged cache: position j of a sequence lives in block table[j / bs].
template <typename T>
struct PagedSource {
  const T* k_cache;
  const T* v_cache;
  const int32_t* block_tables;  // (B, max_blocks)
  const int32_t* context_lens;  // (B)
  int64_t max_blocks, bs, KV, D;

  __device__ int64_t ContextLen(int64_t seq, int64_t /*q_len*/) const { return context_lens[seq]; }
  __device__ int64_t Offset(int64_t seq, int64_t g, int64_t j) const {
    const int64_t block = block_tables[seq * max_blocks + j / bs];
    return ((block * KV + g) * bs + j % bs) * D;
  }
  __device__ const T* Key(int64_t seq, int64_t g, int64_t j) const {
    return k_cache + Offset(seq, g, j);
  }
  __device__ const T* Value(int64_t seq, int64_t g, int64_t j) const {
    return v_cache + Offset(seq, g, j);
  }
};

// Keys and values of packed qkv rows (the learner): the sequence's context is its own rows.
template <typename T>
struct PackedSource {
  const T* qkv;
  const int32_t* cu_seqlens;
  int64_t H, KV, D;

  __device__ int64_t ContextLen(int64_t /*seq*/, int64_t q_len) const { return q_len; }
  __device__ const T* Key(int64_t seq, int64_t g, int64_t j) const {
    return qkv + (cu_seqlens[seq] + j) * (H + 2 * KV) * D + (H + g) * D;
  }
  __device__ const T* Value(int64_t seq, int64_t g, int64_t j) const {
    return qkv + (cu_seqlens[seq] + j) * (H + 2 * KV) * D + (H + KV + g) * D;
  }
};

struct RowArgs {
  const int32_t* plan;       // nullptr: tile b is sequence b's single row (single_token_rows)
  const int32_t* num_tiles;  // with plan
  int64_t num_seqs;          // without plan
  const int32_t* q_start;    // (B + 1) query rows of each sequence in qkv / out
  int64_t H, KV, D, rows_per_tile;
  int64_t splits;
  float scale;
  float* partial = nullptr;  // splits > 1: (T, H, splits, D + 2) of (acc..., m, l)
  float* lse = nullptr;      // splits == 1 and not null: (T, H)
};

template <typename T>
__device__ __forceinline__ void LoadRow(float* dst, const T* src, int64_t D, int64_t first,
                                        int64_t step) {
  for (int64_t d = first; d < D; d += step) dst[d] = ToF32(src[d]);
}

// dynamic shared memory: q (kMaxItems, D), k (kChunk, D + 1), v (kChunk, D)
template <int kPerLane, typename T, class Source>
__global__ void __launch_bounds__(kThreads)
    RowAttentionKernel(T* out, const T* qkv, Source src, RowArgs a) {
  extern __shared__ float smem[];
  const int64_t tile = blockIdx.x;
  if (tile >= (a.plan != nullptr ? *a.num_tiles : a.num_seqs)) return;
  const int64_t D = a.D, G = a.H / a.KV, g = blockIdx.y, split = blockIdx.z;
  const int64_t seq = a.plan != nullptr ? a.plan[2 * tile] : tile;
  const int64_t row0 = a.plan != nullptr ? a.plan[2 * tile + 1] : 0;
  const int64_t q_len = a.q_start[seq + 1] - a.q_start[seq];
  const int64_t rows = min(a.rows_per_tile, q_len - row0);
  const int64_t past = src.ContextLen(seq, q_len) - q_len;  // positions before this step
  const int64_t items = rows * G;
  float* q_s = smem;
  float* k_s = q_s + kMaxItems * D;
  float* v_s = k_s + kChunk * (D + 1);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t width = (a.H + 2 * a.KV) * D;

  for (int64_t i = warp; i < items; i += kWarps) {
    const int64_t t = a.q_start[seq] + row0 + i / G, h = g * G + i % G;
    LoadRow(q_s + i * D, qkv + t * width + h * D, D, lane, 32);
  }
  // Chunks this split covers: up to the last row's visible keys.
  const int64_t chunks = (past + row0 + rows + kChunk - 1) / kChunk;
  // Split over the tile's own context (the grid is sized for the longest possible one, so that
  // a captured graph serves every context length).
  const int64_t per_split = (chunks + a.splits - 1) / a.splits;
  const int64_t c_begin = split * per_split;
  const int64_t c_end = min(chunks, c_begin + per_split);

  float m[kItemsPerWarp], l[kItemsPerWarp], acc[kItemsPerWarp][kPerLane];
#pragma unroll
  for (int ii = 0; ii < kItemsPerWarp; ++ii) {
    m[ii] = -INFINITY;
    l[ii] = 0.0f;
#pragma unroll
    for (int e = 0; e < kPerLane; ++e) acc[ii][e] = 0.0f;
  }

  for (int64_t c = c_begin; c < c_end; ++c) {
    __syncthreads();  // the previous chunk is consumed (and q_s is loaded, the first time)
    // A warp per key row (its block looked up once), the lanes along d: coalesced reads.
    for (int j = warp; j < kChunk; j += kWarps) {
      const int64_t key = c * kChunk + j;
      float* k_row = k_s + j * (D + 1);
      float* v_row = v_s + j * D;
      if (key < past + row0 + rows) {
        LoadRow(k_row, src.Key(seq, g, key), D, lane, 32);
        LoadRow(v_row, src.Value(seq, g, key), D, lane, 32);
      } else {
        for (int64_t d = lane; d < D; d += 32) k_row[d] = v_row[d] = 0.0f;
      }
    }
    __syncthreads();
#pragma unroll
    for (int ii = 0; ii < kItemsPerWarp; ++ii) {
      const int64_t i = warp + ii * kWarps;
      if (i >= items) continue;
      const int64_t visible = past + row0 + i / G + 1;
      if (c * kChunk >= visible) continue;  // this row sees none of the chunk
      const bool valid = c * kChunk + lane < visible;
      const float* q = q_s + i * D;
      const float* k = k_s + lane * (D + 1);
      float dot = 0.0f;
      for (int64_t d = 0; d < D; ++d) dot = fmaf(q[d], k[d], dot);
      const float s = valid ? __fmul_rn(dot, a.scale) : -INFINITY;
      const float m_new = fmaxf(m[ii], WarpMax(s));
      const float corr = expf(__fsub_rn(m[ii], m_new));
      const float p = valid ? expf(__fsub_rn(s, m_new)) : 0.0f;
      l[ii] = __fadd_rn(__fmul_rn(l[ii], corr), WarpSum(p));
#pragma unroll
      for (int e = 0; e < kPerLane; ++e) acc[ii][e] = __fmul_rn(acc[ii][e], corr);
      // Only the row's visible keys touch acc: a masked key's v differs between the paged and
      // the packed source (0 * inf, or the sign of a -0 sum, would break bit equality).
      const int visible_here =
          static_cast<int>(min(static_cast<int64_t>(kChunk), visible - c * kChunk));
      for (int j = 0; j < visible_here; ++j) {
        const float pj = __shfl_sync(0xffffffffu, p, j);
#pragma unroll
        for (int e = 0; e < kPerLane; ++e) {
          const int64_t d = lane + 32 * e;
          if (d < D) acc[ii][e] = fmaf(pj, v_s[j * D + d], acc[ii][e]);
        }
      }
      m[ii] = m_new;
    }
  }

#pragma unroll
  for (int ii = 0; ii < kItemsPerWarp; ++ii) {
    const int64_t i = warp + ii * kWarps;
    if (i >= items) continue;
    const int64_t t = a.q_start[seq] + row0 + i / G, h = g * G + i % G;
    if (a.splits == 1) {
#pragma unroll
      for (int e = 0; e < kPerLane; ++e) {
        const int64_t d = lane + 32 * e;
        if (d < D) out[(t * a.H + h) * D + d] = FromF32<T>(__fdiv_rn(acc[ii][e], l[ii]));
      }
      if (a.lse != nullptr && lane == 0) a.lse[t * a.H + h] = __fadd_rn(m[ii], logf(l[ii]));
    } else {
      float* part = a.partial + ((t * a.H + h) * a.splits + split) * (D + 2);
#pragma unroll
      for (int e = 0; e < kPerLane; ++e) {
        const int64_t d = lane + 32 * e;
        if (d < D) part[d] = acc[ii][e];
      }
      if (lane == 0) {
        part[D] = m[ii];  // -inf (and l = 0) for a split past the row's keys
        part[D + 1] = l[ii];
      }
    }
  }
}

// out (t, h) = the splits' partial results merged; a warp per (t, h).
template <int kPerLane, typename T>
__global__ void MergeSplitsKernel(T* out, const float* partial, int64_t rows, int64_t splits,
                                  int64_t D) {
  const int64_t r = blockIdx.x * static_cast<int64_t>(kWarps) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (r >= rows) return;
  const float* part = partial + r * splits * (D + 2);
  float m = -INFINITY;
  for (int64_t s = 0; s < splits; ++s) m = fmaxf(m, part[s * (D + 2) + D]);
  float l = 0.0f, acc[kPerLane] = {};
  for (int64_t s = 0; s < splits; ++s) {
    const float* p = part + s * (D + 2);
    if (p[D + 1] == 0.0f) continue;  // no keys in this split
    const float w = expf(p[D] - m);
    l += p[D + 1] * w;
#pragma unroll
    for (int e = 0; e < kPerLane; ++e) {
      const int64_t d = lane + 32 * e;
      if (d < D) acc[e] += p[d] * w;
    }
  }
#pragma unroll
  for (int e = 0; e < kPerLane; ++e) {
    const int64_t d = lane + 32 * e;
    if (d < D) out[r * D + d] = FromF32<T>(acc[e] / l);
  }
}

size_t RowSmemBytes(int64_t D) {
  return static_cast<size_t>(kMaxItems * D + kChunk * (D + 1) + kChunk * D) * sizeof(float);
}

// Plans the tiles and launches the row kernel (and the merge for splits > 1).
template <typename T, class Source>
void LaunchRowAttention(int device, T* out, float* lse, const T* qkv, const Source& src,
                        const int32_t* q_start, int64_t num_seqs, int64_t T_, int64_t H, int64_t KV,
                        int64_t D, int64_t max_context, bool invariant,
                        bool single_token_rows = false) {
  PRL_CHECK(H % KV == 0 && H / KV <= kMaxItems, "paged attention: ", H / KV,
            " query heads per kv head, above the supported ", kMaxItems);
  PRL_CHECK(D >= 1 && D <= 256, "paged attention: head_dim ", D, " outside [1, 256]");
  SetDevice(device);
  const cudaStream_t stream = CurrentStream(device);
  const int64_t G = H / KV, R = kMaxItems / G;
  int32_t* plan = nullptr;
  int32_t* num_tiles = nullptr;
  int64_t max_tiles = num_seqs;
  if (!single_token_rows) {
    max_tiles = (T_ + R - 1) / R + num_seqs;
    // Plan: 2 ints per tile, then the count.
    plan = static_cast<int32_t*>(
        ScratchAlloc(device, static_cast<size_t>(2 * max_tiles + 1) * sizeof(int32_t)));
    num_tiles = plan + 2 * max_tiles;
    PlanTilesKernel<<<1, kPlanThreads, 0, stream>>>(plan, num_tiles, q_start, num_seqs,
                                                    static_cast<int32_t>(R));
    PRL_CUDA_CHECK(cudaGetLastError());
  }

  const int64_t chunks = std::max<int64_t>(1, (max_context + kChunk - 1) / kChunk);
  int64_t splits = 1;
  if (!invariant) {
    const int64_t ctas = max_tiles * KV, want = 2 * MultiprocessorCount(device);
    if (ctas < want) splits = std::min<int64_t>(chunks, (want + ctas - 1) / ctas);
  }
  PRL_CHECK(lse == nullptr || splits == 1, "paged attention: lse needs a single split");
  RowArgs a{.plan = plan,
            .num_tiles = num_tiles,
            .num_seqs = num_seqs,
            .q_start = q_start,
            .H = H,
            .KV = KV,
            .D = D,
            .rows_per_tile = R,
            .splits = splits,
            .scale = 1.0f / std::sqrt(static_cast<float>(D)),
            .lse = lse};
  if (splits > 1) {
    a.partial = static_cast<float*>(
        ScratchAlloc(device, static_cast<size_t>(T_ * H * splits * (D + 2)) * sizeof(float)));
  }
  const size_t smem = RowSmemBytes(D);
  const dim3 grid(static_cast<unsigned>(max_tiles), static_cast<unsigned>(KV),
                  static_cast<unsigned>(splits));
  auto launch = [&](auto per_lane) {
    constexpr int kPerLane = decltype(per_lane)::value;
    auto kernel = RowAttentionKernel<kPerLane, T, Source>;
    static std::atomic<bool> configured[kMaxDevices] = {};
    PRL_CHECK(device >= 0 && device < kMaxDevices, "paged attention: device ", device);
    if (!configured[device].load(std::memory_order_acquire)) {  // above 48 KiB for D = 128
      PRL_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          static_cast<int>(RowSmemBytes(32 * kPerLane))));
      configured[device].store(true, std::memory_order_release);
    }
    kernel<<<grid, kThreads, smem, stream>>>(out, qkv, src, a);
    PRL_CUDA_CHECK(cudaGetLastError());
    if (splits > 1) {
      MergeSplitsKernel<kPerLane, T>
          <<<Blocks(T_ * H, kWarps), kThreads, 0, stream>>>(out, a.partial, T_ * H, splits, D);
      PRL_CUDA_CHECK(cudaGetLastError());
    }
  };
  if (D <= 32) {
    launch(std::integral_constant<int, 1>{});
  } else if (D <= 64) {
    launch(std::integral_constant<int, 2>{});
  } else if (D <= 128) {
    launch(std::integral_constant<int, 4>{});
  } else {
    launch(std::integral_constant<int, 8>{});
  }
  if (a.partial != nullptr) ScratchFree(device, a.partial);
  if (plan != nullptr) ScratchFree(device, plan);
}

}  // namespace

void KvCacheWrite(int device, DType dt, void* k_cache, void* v_cache, const void* qkv,
                  const int32_t* slots, int64_t T_, int64_t H, int64_t KV, int64_t D,
                  int64_t block_size) {
  if (T_ == 0) return;
  SetDevice(device);
  DispatchDType(dt, [&](auto tag) {
    using T = decltype(tag);
    KvWriteKernel<T><<<Blocks(T_ * KV * D, 256), 256, 0, CurrentStream(device)>>>(
        static_cast<T*>(k_cache), static_cast<T*>(v_cache), static_cast<const T*>(qkv), slots, T_,
        H, KV, D, block_size);
  });
  PRL_CUDA_CHECK(cudaGetLastError());
}

void RopeKvCacheWrite(int device, DType dt, void* k_cache, void* v_cache, void* qkv,
                      const int32_t* slots, const float* cos, const float* sin, int64_t T_,
                      int64_t H, int64_t KV, int64_t D, int64_t block_size) {
  if (T_ == 0) return;
  SetDevice(device);
  DispatchDType(dt, [&](auto tag) {
    using T = decltype(tag);
    RopeKvWriteKernel<T>
        <<<Blocks(T_ * (H + 2 * KV) * (D / 2), 256), 256, 0, CurrentStream(device)>>>(
            static_cast<T*>(k_cache), static_cast<T*>(v_cache), static_cast<T*>(qkv), slots, cos,
            sin, T_, H, KV, D, block_size);
  });
  PRL_CUDA_CHECK(cudaGetLastError());
}

void KvCacheCopyBlocks(int device, void* k_cache, void* v_cache, const int32_t* pairs,
                       int64_t num_pairs, int64_t block_bytes) {
  if (num_pairs == 0) return;
  PRL_CHECK(block_bytes % 16 == 0, "KvCacheCopyBlocks: a block of ", block_bytes,
            " bytes is not a multiple of 16");
  PRL_CHECK(num_pairs <= 65535, "KvCacheCopyBlocks: ", num_pairs, " pairs above 65535 per call");
  SetDevice(device);
  const int64_t vecs = block_bytes / 16;
  CopyBlocksKernel<<<dim3(GridStrideBlocks(vecs, 256, 64), static_cast<unsigned>(num_pairs)), 256,
                     0, CurrentStream(device)>>>(static_cast<uint4*>(k_cache),
                                                 static_cast<uint4*>(v_cache), pairs, vecs);
  PRL_CUDA_CHECK(cudaGetLastError());
}

void PagedAttentionForward(int device, DType dt, void* out, const void* qkv, const void* k_cache,
                           const void* v_cache, const int32_t* block_tables, int64_t max_blocks,
                           const int32_t* q_start, const int32_t* context_lens, int64_t num_seqs,
                           int64_t T_, int64_t H, int64_t KV, int64_t D, int64_t block_size,
                           bool invariant, bool single_token_rows) {
  if (T_ == 0 || num_seqs == 0) return;
  if (single_token_rows && !invariant && DecodeAttentionSupported(dt, H, KV, D)) {
    return DecodeAttention(device, dt, out, qkv, k_cache, v_cache, block_tables, max_blocks,
                           context_lens, num_seqs, H, KV, D, block_size);
  }
  DispatchDType(dt, [&](auto tag) {
    using T = decltype(tag);
    const PagedSource<T> src{static_cast<const T*>(k_cache),
                             static_cast<const T*>(v_cache),
                             block_tables,
                             context_lens,
                             max_blocks,
                             block_size,
                             KV,
                             D};
    LaunchRowAttention<T>(device, static_cast<T*>(out), nullptr, static_cast<const T*>(qkv), src,
                          q_start, num_seqs, T_, H, KV, D, max_blocks * block_size, invariant,
                          single_token_rows);
  });
}

void AttentionForwardInvariant(int device, DType dt, void* out, float* lse, const void* qkv,
                               const int32_t* cu_seqlens, int64_t num_seqs, int64_t T_, int64_t H,
                               int64_t KV, int64_t D) {
  if (T_ == 0 || num_seqs == 0) return;
  DispatchDType(dt, [&](auto tag) {
    using T = decltype(tag);
    const PackedSource<T> src{static_cast<const T*>(qkv), cu_seqlens, H, KV, D};
    // One split: the longest context a row can have is T.
    LaunchRowAttention<T>(device, static_cast<T*>(out), lse, static_cast<const T*>(qkv), src,
                          cu_seqlens, num_seqs, T_, H, KV, D, T_, /*invariant=*/true);
  });
}

}  // namespace prl::kernels::cuda
