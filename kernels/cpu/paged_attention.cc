// Paged KV cache kernels for the engine: writing new k/v into their slots, copying blocks,
// and causal attention of the step's query rows against a sequence's cached context.
//
// Layout (vLLM-like): a block holds block_size consecutive positions of one sequence, per KV
// head. Keys are stored transposed within a block, (D, block_size), so that scoring a query
// against a block is D vector FMAs over eight keys at a time with no horizontal sums; values
// are (block_size, D) rows, which the weighted sum reads contiguously.
//
// Rows are attended one by one (invariant_dot.h's fixed order, reading the blocks in place)
// in batch-invariant mode and for decode-like rows; prefill chunks of the fast mode gather the
// context once per (sequence, kv head, 64 query rows) and use GEMMs.
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
constexpr int64_t kRowwiseBelow = 4;  // a sequence's query rows below which they go one by one

struct PagedHead {
  const float* k_cache;
  const float* v_cache;
  const int32_t* table;  // this sequence's block table
  int64_t g, KV, D, bs;

  const float* KeyBlock(int64_t b) const {  // (D, bs)
    return k_cache + (static_cast<int64_t>(table[b]) * KV + g) * D * bs;
  }
  const float* Value(int64_t pos) const {  // (D)
    return v_cache + ((static_cast<int64_t>(table[pos / bs]) * KV + g) * bs + pos % bs) * D;
  }
};

// Scores of q against positions [0, n) of a paged head.
void ScorePaged(float* s, const float* q, const PagedHead& head, int64_t n, float scale) {
  for (int64_t pos = 0; pos < n; pos += head.bs) {
    ScoreKeyBlockTransposed(s + pos, q, head.KeyBlock(pos / head.bs), head.bs,
                            std::min(head.bs, n - pos), head.D, scale);
  }
}

// keys_t (D, n) and values (n, D) = positions [0, n) of a paged head, contiguous.
void Gather(float* keys_t, float* values, const PagedHead& head, int64_t n) {
  for (int64_t pos = 0; pos < n; pos += head.bs) {
    const int64_t rows = std::min(head.bs, n - pos);
    const float* kb = head.KeyBlock(pos / head.bs);
    for (int64_t d = 0; d < head.D; ++d) {
      std::memcpy(keys_t + d * n + pos, kb + d * head.bs, rows * sizeof(float));
    }
    std::memcpy(values + pos * head.D, head.Value(pos), rows * head.D * sizeof(float));
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
      const float* k = qkv + t * stride + (H + g) * D;
      float* kt = k_cache + (block * KV + g) * D * block_size + offset;
      for (int64_t d = 0; d < D; ++d) kt[d * block_size] = k[d];
      std::memcpy(v_cache + ((block * KV + g) * block_size + offset) * D,
                  qkv + t * stride + (H + KV + g) * D, D * sizeof(float));
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
  for (int64_t b = 0; b < num_seqs; ++b) {
    max_context = std::max<int64_t>(max_context, context_lens[b]);
  }

  struct Item {
    int64_t seq, head, row0, row1;  // head: query head (by row) or kv head (gathered)
    bool by_row;
  };
  std::vector<Item> items;
  for (int64_t b = 0; b < num_seqs; ++b) {
    const int64_t q_len = q_start[b + 1] - q_start[b];
    const bool by_row = invariant || q_len < kRowwiseBelow;
    const int64_t row_block = by_row ? 1 : kQueryBlock;
    for (int64_t h = 0; h < (by_row ? H : KV); ++h) {
      for (int64_t r = 0; r < q_len; r += row_block) {
        items.push_back({b, h, r, std::min(q_len, r + row_block), by_row});
      }
    }
  }

#pragma omp parallel
  {
    thread_local std::vector<float> keys_t, values, scores;
    keys_t.resize(max_context * D);
    values.resize(max_context * D);
    scores.resize(kQueryBlock * max_context);
#pragma omp for schedule(dynamic, 1)
    for (size_t it = 0; it < items.size(); ++it) {
      const Item& item = items[it];
      const int64_t q_len = q_start[item.seq + 1] - q_start[item.seq];
      const int64_t past = context_lens[item.seq] - q_len;  // positions before this step
      const int32_t* table = block_tables + item.seq * max_blocks;
      if (item.by_row) {
        const int64_t t = q_start[item.seq] + item.row0, visible = past + item.row0 + 1;
        const PagedHead head{k_cache, v_cache, table, item.head / group, KV, D, block_size};
        ScorePaged(scores.data(), qkv + t * stride + item.head * D, head, visible, scale);
        // Keys come in order: step through the blocks instead of dividing per key.
        int64_t block = -1, offset = head.bs;
        const float* base = nullptr;
        SoftmaxValueSum(out + t * out_stride + item.head * D, scores.data(), visible, D,
                        [&](int64_t) {
                          if (offset == head.bs) {
                            base = head.Value(++block * head.bs);
                            offset = 0;
                          }
                          return base + (offset++) * D;
                        });
        continue;
      }
      const PagedHead head{k_cache, v_cache, table, item.head, KV, D, block_size};
      const int64_t nq = item.row1 - item.row0;
      const int64_t nk = past + item.row1;  // the block's last row sees positions [0, nk)
      Gather(keys_t.data(), values.data(), head, nk);
      for (int64_t h = item.head * group; h < (item.head + 1) * group; ++h) {
        const int64_t t0 = q_start[item.seq] + item.row0;
        float* s = scores.data();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nq, nk, D, scale,
                    qkv + t0 * stride + h * D, stride, keys_t.data(), nk, 0.0f, s, nk);
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
