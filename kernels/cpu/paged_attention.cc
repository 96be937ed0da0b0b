// Paged KV cache kernels for the engine: writing new k/v into their slots, copying blocks,
// and causal attention of the step's query rows against a sequence's cached context.
//
// The fast path gathers one KV head's keys and values of a sequence into contiguous scratch
// (a block is one head's block_size rows, so the gather is a run of memcpys) and reuses the
// GEMM formulation of the packed attention; work items are (sequence, kv head, query block).
// The invariant path attends row by row with AttendRowInvariant, reading keys through the
// block table, exactly as the packed invariant attention does.
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/invariant_dot.h"
#include "kernels/cpu/vec_math.h"

namespace prl::kernels::cpu {

namespace {

constexpr int64_t kQueryBlock = 64;

struct PagedView {
  const float* cache;
  const int32_t* table;  // this sequence's block table
  int64_t KV, D, block_size;
  // Row of kv head g at position pos.
  const float* Row(int64_t g, int64_t pos) const {
    const int64_t block = table[pos / block_size];
    return cache + ((block * KV + g) * block_size + pos % block_size) * D;
  }
};

// dst (n, D) = positions [0, n) of kv head g, contiguous.
void Gather(float* dst, const PagedView& view, int64_t g, int64_t n) {
  for (int64_t pos = 0; pos < n; pos += view.block_size) {
    const int64_t rows = std::min(view.block_size, n - pos);
    std::memcpy(dst + pos * view.D, view.Row(g, pos), rows * view.D * sizeof(float));
  }
}

}  // namespace

void KvCacheWrite(float* k_cache, float* v_cache, const float* qkv, const int32_t* slots, int64_t T,
                  int64_t H, int64_t KV, int64_t D, int64_t block_size) {
  const int64_t stride = (H + 2 * KV) * D;
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < T; ++t) {
    if (slots[t] < 0) continue;
    const int64_t block = slots[t] / block_size, offset = slots[t] % block_size;
    for (int64_t g = 0; g < KV; ++g) {
      const int64_t dst = ((block * KV + g) * block_size + offset) * D;
      std::memcpy(k_cache + dst, qkv + t * stride + (H + g) * D, D * sizeof(float));
      std::memcpy(v_cache + dst, qkv + t * stride + (H + KV + g) * D, D * sizeof(float));
    }
  }
}

void KvCacheCopyBlocks(float* k_cache, float* v_cache, const int32_t* pairs, int64_t num_pairs,
                       int64_t KV, int64_t D, int64_t block_size) {
  const int64_t block_floats = KV * block_size * D;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < num_pairs; ++i) {
    const int64_t src = pairs[2 * i] * block_floats, dst = pairs[2 * i + 1] * block_floats;
    std::memcpy(k_cache + dst, k_cache + src, block_floats * sizeof(float));
    std::memcpy(v_cache + dst, v_cache + src, block_floats * sizeof(float));
  }
}

void PagedAttentionForward(float* out, const float* qkv, const float* k_cache, const float* v_cache,
                           const int32_t* block_tables, int64_t max_blocks, const int32_t* q_start,
                           const int32_t* context_lens, int64_t num_seqs, int64_t H, int64_t KV,
                           int64_t D, int64_t block_size, bool invariant) {
  const int64_t stride = (H + 2 * KV) * D;
  const int64_t out_stride = H * D;
  const int64_t group = H / KV;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  int64_t max_context = 0;
  for (int64_t b = 0; b < num_seqs; ++b)
    max_context = std::max<int64_t>(max_context, context_lens[b]);

  struct Item {
    int64_t seq, head, row0, row1;  // head: kv head (fast path) or query head (invariant)
  };
  std::vector<Item> items;
  for (int64_t b = 0; b < num_seqs; ++b) {
    const int64_t q_len = q_start[b + 1] - q_start[b];
    const int64_t row_block = invariant ? 1 : kQueryBlock;
    for (int64_t h = 0; h < (invariant ? H : KV); ++h) {
      for (int64_t r = 0; r < q_len; r += row_block) {
        items.push_back({b, h, r, std::min(q_len, r + row_block)});
      }
    }
  }

#pragma omp parallel
  {
    thread_local std::vector<float> keys, values, scores;
    keys.resize(max_context * D);
    values.resize(max_context * D);
    scores.resize(kQueryBlock * max_context);
#pragma omp for schedule(dynamic, 1)
    for (size_t it = 0; it < items.size(); ++it) {
      const Item& item = items[it];
      const int64_t q_len = q_start[item.seq + 1] - q_start[item.seq];
      const int64_t past = context_lens[item.seq] - q_len;  // positions before this step
      const PagedView kview{k_cache, block_tables + item.seq * max_blocks, KV, D, block_size};
      const PagedView vview{v_cache, block_tables + item.seq * max_blocks, KV, D, block_size};
      if (invariant) {
        const int64_t t = q_start[item.seq] + item.row0, g = item.head / group;
        AttendRowInvariant(
            out + t * out_stride + item.head * D, qkv + t * stride + item.head * D,
            [&](int64_t j) { return kview.Row(g, j); }, [&](int64_t j) { return vview.Row(g, j); },
            past + item.row0 + 1, D, scale, scores.data());
        continue;
      }
      const int64_t nq = item.row1 - item.row0;
      const int64_t nk = past + item.row1;  // the block's last row sees positions [0, nk)
      Gather(keys.data(), kview, item.head, nk);
      Gather(values.data(), vview, item.head, nk);
      for (int64_t h = item.head * group; h < (item.head + 1) * group; ++h) {
        const int64_t t0 = q_start[item.seq] + item.row0;
        float* s = scores.data();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nq, nk, D, scale,
                    qkv + t0 * stride + h * D, stride, keys.data(), D, 0.0f, s, nk);
        for (int64_t i = 0; i < nq; ++i) {
          float* row = s + i * nk;
          const int64_t visible = past + item.row0 + i + 1;
          const float row_max = RowMax(row, visible);
          const double sum = SumExp</*kStore=*/true>(row, visible, row_max);
          const float inv_sum = static_cast<float>(1.0 / sum);
          for (int64_t j = 0; j < visible; ++j) row[j] *= inv_sum;
          std::fill(row + visible, row + nk, 0.0f);
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nq, D, nk, 1.0f, s, nk,
                    values.data(), D, 0.0f, out + t0 * out_stride + h * D, out_stride);
      }
    }
  }
}

}  // namespace prl::kernels::cpu
