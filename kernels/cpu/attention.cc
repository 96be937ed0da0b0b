// Causal attention over packed variable-length sequences, fp32, GQA.
//
// Forward works on blocks of kQueryBlock query rows: one GEMM gives the block's scores
// against every key it may see, a row softmax turns them into probabilities (and the row's
// log-sum-exp, kept for the backward), and a second GEMM applies them to V. Only a
// (kQueryBlock, seq_len) score block per thread exists at a time.
//
// Backward recomputes each score block from Q, K and the saved log-sum-exp (FlashAttention's
// trick: O(T) memory between passes). Work items are (sequence, query head). The key/value
// gradients of the heads that share a KV head are accumulated per head in a scratch buffer
// and summed in a fixed head order afterwards, so the result does not depend on thread timing.
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/invariant_dot.h"
#include "kernels/cpu/kv_group_sum.h"
#include "kernels/cpu/vec_math.h"

namespace prl::kernels::cpu {

namespace {

constexpr int64_t kQueryBlock = 64;

struct Item {
  int64_t seq;
  int64_t head;
  int64_t block;  // query block index within the sequence (forward only)
  int64_t cost;   // for ordering: bigger items first balances the dynamic schedule
};

int64_t MaxSeqLen(const int32_t* cu_seqlens, int64_t num_seqs) {
  int64_t max_len = 0;
  for (int64_t b = 0; b < num_seqs; ++b) {
    max_len = std::max<int64_t>(max_len, cu_seqlens[b + 1] - cu_seqlens[b]);
  }
  return max_len;
}

}  // namespace

void AttentionForward(float* out, float* lse, const float* qkv, const int32_t* cu_seqlens,
                      int64_t num_seqs, int64_t H, int64_t KV, int64_t D) {
  const int64_t qkv_stride = (H + 2 * KV) * D;
  const int64_t out_stride = H * D;
  const int64_t group = H / KV;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));

  std::vector<Item> items;
  for (int64_t b = 0; b < num_seqs; ++b) {
    const int64_t len = cu_seqlens[b + 1] - cu_seqlens[b];
    for (int64_t h = 0; h < H; ++h) {
      for (int64_t qb = 0; qb * kQueryBlock < len; ++qb) {
        items.push_back({b, h, qb, std::min(len, (qb + 1) * kQueryBlock)});
      }
    }
  }
  std::stable_sort(items.begin(), items.end(),
                   [](const Item& a, const Item& b) { return a.cost > b.cost; });
  const int64_t max_len = MaxSeqLen(cu_seqlens, num_seqs);

#pragma omp parallel
  {
    // Per-thread scratch kept across calls: a fresh 128 KiB+ vector per call is an mmap and
    // page faults every time.
    thread_local std::vector<float> scores;
    scores.resize(kQueryBlock * max_len);
#pragma omp for schedule(dynamic, 1)
    for (size_t it = 0; it < items.size(); ++it) {
      const Item& item = items[it];
      const int64_t start = cu_seqlens[item.seq];
      const int64_t len = cu_seqlens[item.seq + 1] - start;
      const int64_t q0 = item.block * kQueryBlock;
      const int64_t q1 = std::min(len, q0 + kQueryBlock);
      const int64_t nq = q1 - q0;
      const int64_t nk = q1;  // causal: the block's last query sees keys [0, q1)
      const int64_t g = item.head / group;
      const float* q = qkv + (start + q0) * qkv_stride + item.head * D;
      const float* k = qkv + start * qkv_stride + (H + g) * D;
      const float* v = qkv + start * qkv_stride + (H + KV + g) * D;
      float* s = scores.data();

      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nq, nk, D, scale, q, qkv_stride, k,
                  qkv_stride, 0.0f, s, nk);
      for (int64_t i = 0; i < nq; ++i) {
        float* row = s + i * nk;
        const int64_t visible = q0 + i + 1;
        const float row_max = RowMax(row, visible);
        const double sum = SumExp</*kStore=*/true>(row, visible, row_max);
        const float inv_sum = static_cast<float>(1.0 / sum);
        for (int64_t j = 0; j < visible; ++j) row[j] *= inv_sum;
        std::fill(row + visible, row + nk, 0.0f);
        lse[(start + q0 + i) * H + item.head] = row_max + static_cast<float>(std::log(sum));
      }
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nq, D, nk, 1.0f, s, nk, v, qkv_stride,
                  0.0f, out + (start + q0) * out_stride + item.head * D, out_stride);
    }
  }
}

void AttentionBackward(float* dqkv, const float* dout, const float* qkv, const float* out,
                       const float* lse, const int32_t* cu_seqlens, int64_t num_seqs, int64_t H,
                       int64_t KV, int64_t D) {
  const int64_t qkv_stride = (H + 2 * KV) * D;
  const int64_t out_stride = H * D;
  const int64_t group = H / KV;
  const int64_t T = cu_seqlens[num_seqs];
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));

  // Per query head dK and dV, (H, T, D) each; summed over each KV group at the end.
  thread_local std::vector<float> head_grads;
  head_grads.resize(static_cast<size_t>(2 * H * T * D));
  float* dk_heads = head_grads.data();
  float* dv_heads = dk_heads + H * T * D;

  std::vector<Item> items;
  for (int64_t b = 0; b < num_seqs; ++b) {
    const int64_t len = cu_seqlens[b + 1] - cu_seqlens[b];
    for (int64_t h = 0; h < H; ++h) items.push_back({b, h, 0, len});
  }
  std::stable_sort(items.begin(), items.end(),
                   [](const Item& a, const Item& b) { return a.cost > b.cost; });
  const int64_t max_len = MaxSeqLen(cu_seqlens, num_seqs);

#pragma omp parallel
  {
    thread_local std::vector<float> p_block, dp_block;
    p_block.resize(kQueryBlock * max_len);
    dp_block.resize(kQueryBlock * max_len);
#pragma omp for schedule(dynamic, 1)
    for (size_t it = 0; it < items.size(); ++it) {
      const int64_t h = items[it].head;
      const int64_t start = cu_seqlens[items[it].seq];
      const int64_t len = cu_seqlens[items[it].seq + 1] - start;
      const int64_t g = h / group;
      const float* k = qkv + start * qkv_stride + (H + g) * D;
      const float* v = qkv + start * qkv_stride + (H + KV + g) * D;
      float* dk = dk_heads + (h * T + start) * D;  // (len, D), leading dimension D
      float* dv = dv_heads + (h * T + start) * D;
      std::memset(dk, 0, len * D * sizeof(float));
      std::memset(dv, 0, len * D * sizeof(float));

      for (int64_t q0 = 0; q0 < len; q0 += kQueryBlock) {
        const int64_t q1 = std::min(len, q0 + kQueryBlock);
        const int64_t nq = q1 - q0;
        const int64_t nk = q1;
        const float* q = qkv + (start + q0) * qkv_stride + h * D;
        const float* o = out + (start + q0) * out_stride + h * D;
        const float* dout_block = dout + (start + q0) * out_stride + h * D;
        float* dq = dqkv + (start + q0) * qkv_stride + h * D;
        float* p = p_block.data();
        float* dp = dp_block.data();

        // P = exp(scale * Q K^T - lse), zero above the diagonal.
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nq, nk, D, scale, q, qkv_stride, k,
                    qkv_stride, 0.0f, p, nk);
        for (int64_t i = 0; i < nq; ++i) {
          float* row = p + i * nk;
          const int64_t visible = q0 + i + 1;
          const float row_lse = lse[(start + q0 + i) * H + h];
          ScaledExp(row, row, visible, row_lse, 1.0f);
          std::fill(row + visible, row + nk, 0.0f);
        }
        // dV += P^T dO
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, nk, D, nq, 1.0f, p, nk, dout_block,
                    out_stride, 1.0f, dv, D);
        // dP = dO V^T;  dS = P * (dP - rowsum(dO * O))
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nq, nk, D, 1.0f, dout_block,
                    out_stride, v, qkv_stride, 0.0f, dp, nk);
        for (int64_t i = 0; i < nq; ++i) {
          float delta = 0.0f;
          for (int64_t d = 0; d < D; ++d)
            delta += dout_block[i * out_stride + d] * o[i * out_stride + d];
          float* ds_row = dp + i * nk;
          const float* p_row = p + i * nk;
          for (int64_t j = 0; j < nk; ++j) ds_row[j] = p_row[j] * (ds_row[j] - delta);
        }
        // dQ = scale * dS K;  dK += scale * dS^T Q
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nq, D, nk, scale, dp, nk, k,
                    qkv_stride, 0.0f, dq, qkv_stride);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, nk, D, nq, scale, dp, nk, q,
                    qkv_stride, 1.0f, dk, D);
      }
    }

    SumKvGroupGrads(dqkv, qkv_stride, H * D, (H + KV) * D, dk_heads, dv_heads, T, H, KV, D,
                    /*accumulate=*/false);
  }
}

}  // namespace prl::kernels::cpu

namespace prl::kernels::cpu {

void AttentionForwardInvariant(float* out, float* lse, const float* qkv, const int32_t* cu_seqlens,
                               int64_t num_seqs, int64_t H, int64_t KV, int64_t D) {
  const int64_t qkv_stride = (H + 2 * KV) * D;
  const int64_t group = H / KV;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const int64_t T = cu_seqlens[num_seqs];
  const int64_t max_len = MaxSeqLen(cu_seqlens, num_seqs);
  std::vector<int32_t> seq_of(T);
  for (int64_t b = 0; b < num_seqs; ++b) {
    for (int32_t t = cu_seqlens[b]; t < cu_seqlens[b + 1]; ++t) seq_of[t] = static_cast<int32_t>(b);
  }
#pragma omp parallel
  {
    thread_local std::vector<float> scores;
    scores.resize(max_len);
#pragma omp for collapse(2) schedule(dynamic, 16)
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t h = 0; h < H; ++h) {
        const int64_t start = cu_seqlens[seq_of[t]];
        const int64_t g = h / group;
        const float* k = qkv + start * qkv_stride + (H + g) * D;
        const float* v = qkv + start * qkv_stride + (H + KV + g) * D;
        const int64_t visible = t - start + 1;
        ScoreKeyRows(scores.data(), qkv + t * qkv_stride + h * D, k, qkv_stride, visible, D, scale);
        lse[t * H + h] = SoftmaxValueSum(out + t * H * D + h * D, scores.data(), visible, D,
                                         [&](int64_t j) { return v + j * qkv_stride; });
      }
    }
  }
}

}  // namespace prl::kernels::cpu
