// Causal attention over runs of query positions, fp32, GQA: the blocked kernels both the packed
// attention (attention.cc: every sequence one run at position 0, keys and values in the same
// q|k|v rows) and the context-parallel one (kernels/context_attention.h: a rank's runs against
// the group's gathered k|v rows) run.
//
// Forward works on blocks of kQueryBlock query rows: one GEMM gives the block's scores against
// every key it may see, a row softmax turns them into probabilities (and the row's log-sum-exp,
// kept for the backward), and a second GEMM applies them to V. Only a (kQueryBlock, keys) score
// block per thread exists at a time. Backward recomputes each score block from Q, K and the
// saved log-sum-exp (FlashAttention's trick); its work items are (sequence, query head), whose
// key/value gradients are kept per head and summed per KV group in a fixed order
// (kv_group_sum.h), so the result does not depend on thread timing.
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/kv_group_sum.h"
#include "kernels/cpu/vec_math.h"

namespace prl::kernels::cpu {

namespace {

constexpr int64_t kQueryBlock = 64;

// The keys a piece's queries [0, q1) see, together (a block's, or the last one's prefix), and
// the keys query i sees.
int64_t KeysOf(const QueryPiece& p, int64_t q1) { return p.keys > 0 ? p.keys : p.pos0 + q1; }
int64_t VisibleOf(const QueryPiece& p, int64_t i) { return p.keys > 0 ? p.keys : p.pos0 + i + 1; }

int64_t MaxKeys(const QueryPiece* pieces, int64_t n) {
  int64_t max_keys = 0;
  for (int64_t i = 0; i < n; ++i) max_keys = std::max(max_keys, KeysOf(pieces[i], pieces[i].len));
  return max_keys;
}

}  // namespace

void ContextAttentionForward(float* out, float* lse, const float* qkv, const KvRows& kv,
                             const QueryPiece* pieces, int64_t num_pieces, int64_t H, int64_t KV,
                             int64_t D) {
  const int64_t qkv_stride = (H + 2 * KV) * D, kv_stride = kv.stride, out_stride = H * D;
  const int64_t group = H / KV;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  struct Item {
    int64_t piece, head, q0, cost;
  };
  std::vector<Item> items;
  for (int64_t i = 0; i < num_pieces; ++i) {
    for (int64_t h = 0; h < H; ++h) {
      for (int64_t q0 = 0; q0 < pieces[i].len; q0 += kQueryBlock) {
        items.push_back({i, h, q0, KeysOf(pieces[i], std::min(pieces[i].len, q0 + kQueryBlock))});
      }
    }
  }
  std::stable_sort(items.begin(), items.end(),
                   [](const Item& a, const Item& b) { return a.cost > b.cost; });
  const int64_t max_keys = MaxKeys(pieces, num_pieces);

#pragma omp parallel
  {
    thread_local std::vector<float> scores;
    scores.resize(kQueryBlock * max_keys);
#pragma omp for schedule(dynamic, 1)
    for (size_t it = 0; it < items.size(); ++it) {
      const QueryPiece& p = pieces[items[it].piece];
      const int64_t h = items[it].head, g = h / group;
      const int64_t q0 = items[it].q0, q1 = std::min(p.len, q0 + kQueryBlock), nq = q1 - q0;
      const int64_t nk = KeysOf(p, q1);  // the block's last query sees positions [0, nk)
      const float* q = qkv + (p.row0 + q0) * qkv_stride + h * D;
      const float* k = kv.rows + p.kv0 * kv_stride + kv.k_col + g * D;
      const float* v = kv.rows + p.kv0 * kv_stride + kv.v_col + g * D;
      float* s = scores.data();
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nq, nk, D, scale, q, qkv_stride, k,
                  kv_stride, 0.0f, s, nk);
      for (int64_t i = 0; i < nq; ++i) {
        float* row = s + i * nk;
        const int64_t visible = VisibleOf(p, q0 + i);
        const float row_max = RowMax(row, visible);
        const double sum = SumExp</*kStore=*/true>(row, visible, row_max);
        const float inv_sum = static_cast<float>(1.0 / sum);
        for (int64_t j = 0; j < visible; ++j) row[j] *= inv_sum;
        std::fill(row + visible, row + nk, 0.0f);
        lse[(p.row0 + q0 + i) * H + h] = row_max + static_cast<float>(std::log(sum));
      }
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nq, D, nk, 1.0f, s, nk, v, kv_stride,
                  0.0f, out + (p.row0 + q0) * out_stride + h * D, out_stride);
    }
  }
}

void ContextAttentionBackward(float* dqkv, const KvGrads& dkv, const float* dout,
                              const float* qkv, const KvRows& kv, const float* out,
                              const float* lse, const QueryPiece* pieces, int64_t num_pieces,
                              int64_t H, int64_t KV, int64_t D, int64_t kv_rows) {
  const int64_t qkv_stride = (H + 2 * KV) * D, kv_stride = kv.stride, out_stride = H * D;
  const int64_t group = H / KV;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  // Work items are (sequence, query head): a sequence's pieces share its key rows, which one
  // item accumulates. Per query head dK and dV, (H, kv_rows, D) each, summed per KV group after.
  std::map<int64_t, std::vector<int64_t>> pieces_of;  // by kv0
  for (int64_t i = 0; i < num_pieces; ++i) pieces_of[pieces[i].kv0].push_back(i);
  struct Item {
    int64_t kv0, head, keys;
  };
  std::vector<Item> items;
  for (const auto& [kv0, list] : pieces_of) {
    int64_t keys = 0;
    for (int64_t i : list) keys = std::max(keys, KeysOf(pieces[i], pieces[i].len));
    for (int64_t h = 0; h < H; ++h) items.push_back({kv0, h, keys});
  }
  std::stable_sort(items.begin(), items.end(),
                   [](const Item& a, const Item& b) { return a.keys > b.keys; });
  thread_local std::vector<float> head_grads;
  head_grads.assign(static_cast<size_t>(2 * H * kv_rows * D), 0.0f);
  float* dk_heads = head_grads.data();
  float* dv_heads = dk_heads + H * kv_rows * D;
  const int64_t max_keys = MaxKeys(pieces, num_pieces);

#pragma omp parallel
  {
    thread_local std::vector<float> p_block, dp_block;
    p_block.resize(kQueryBlock * max_keys);
    dp_block.resize(kQueryBlock * max_keys);
#pragma omp for schedule(dynamic, 1)
    for (size_t it = 0; it < items.size(); ++it) {
      const int64_t h = items[it].head, g = h / group, kv0 = items[it].kv0;
      const float* k = kv.rows + kv0 * kv_stride + kv.k_col + g * D;
      const float* v = kv.rows + kv0 * kv_stride + kv.v_col + g * D;
      float* dk = dk_heads + (h * kv_rows + kv0) * D;  // (keys, D), leading dimension D
      float* dv = dv_heads + (h * kv_rows + kv0) * D;
      for (const int64_t pi : pieces_of.at(kv0)) {
        const QueryPiece& p = pieces[pi];
        for (int64_t q0 = 0; q0 < p.len; q0 += kQueryBlock) {
          const int64_t q1 = std::min(p.len, q0 + kQueryBlock), nq = q1 - q0;
          const int64_t nk = KeysOf(p, q1);
          const float* q = qkv + (p.row0 + q0) * qkv_stride + h * D;
          const float* o = out + (p.row0 + q0) * out_stride + h * D;
          const float* dout_block = dout + (p.row0 + q0) * out_stride + h * D;
          float* dq = dqkv + (p.row0 + q0) * qkv_stride + h * D;
          float* pb = p_block.data();
          float* dp = dp_block.data();
          // P = exp(scale * Q K^T - lse), zero past each query's position.
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nq, nk, D, scale, q, qkv_stride, k,
                      kv_stride, 0.0f, pb, nk);
          for (int64_t i = 0; i < nq; ++i) {
            float* row = pb + i * nk;
            const int64_t visible = VisibleOf(p, q0 + i);
            ScaledExp(row, row, visible, lse[(p.row0 + q0 + i) * H + h], 1.0f);
            std::fill(row + visible, row + nk, 0.0f);
          }
          // dV += P^T dO
          cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, nk, D, nq, 1.0f, pb, nk,
                      dout_block, out_stride, 1.0f, dv, D);
          // dP = dO V^T;  dS = P * (dP - rowsum(dO * O))
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nq, nk, D, 1.0f, dout_block,
                      out_stride, v, kv_stride, 0.0f, dp, nk);
          for (int64_t i = 0; i < nq; ++i) {
            float delta = 0.0f;
            for (int64_t d = 0; d < D; ++d) {
              delta += dout_block[i * out_stride + d] * o[i * out_stride + d];
            }
            float* ds_row = dp + i * nk;
            const float* p_row = pb + i * nk;
            for (int64_t j = 0; j < nk; ++j) ds_row[j] = p_row[j] * (ds_row[j] - delta);
          }
          // dQ = scale * dS K;  dK += scale * dS^T Q
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nq, D, nk, scale, dp, nk, k,
                      kv_stride, 0.0f, dq, qkv_stride);
          cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, nk, D, nq, scale, dp, nk, q,
                      qkv_stride, 1.0f, dk, D);
        }
      }
    }

    // dkv (+)= the per-head key/value gradients of each KV group.
    SumKvGroupGrads(dkv.rows, dkv.stride, dkv.k_col, dkv.v_col, dk_heads, dv_heads, kv_rows, H,
                    KV, D, dkv.accumulate);
  }
}

}  // namespace prl::kernels::cpu
