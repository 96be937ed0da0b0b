// Causal attention over packed variable-length sequences, fp32, GQA: the fast order is
// context_attention.cc's blocked kernels with every sequence one run of queries (forward and
// backward, deterministic whatever the threads); the batch-invariant forward computes each row in
// a fixed order (invariant_dot.h), as the engine's paged attention does.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/invariant_dot.h"
#include "kernels/cpu/vec_math.h"

namespace prl::kernels::cpu {

namespace {

int64_t MaxSeqLen(const int32_t* cu_seqlens, int64_t num_seqs) {
  int64_t max_len = 0;
  for (int64_t b = 0; b < num_seqs; ++b) {
    max_len = std::max<int64_t>(max_len, cu_seqlens[b + 1] - cu_seqlens[b]);
  }
  return max_len;
}

}  // namespace

namespace {

// Each sequence of the pack one run of queries at position 0, its keys its own rows.
std::vector<QueryPiece> SequencePieces(const int32_t* cu_seqlens, int64_t num_seqs) {
  std::vector<QueryPiece> pieces;
  for (int64_t b = 0; b < num_seqs; ++b) {
    const int64_t len = cu_seqlens[b + 1] - cu_seqlens[b];
    if (len > 0) pieces.push_back({cu_seqlens[b], len, 0, cu_seqlens[b]});
  }
  return pieces;
}

}  // namespace

void AttentionForward(float* out, float* lse, const float* qkv, const int32_t* cu_seqlens,
                      int64_t num_seqs, int64_t H, int64_t KV, int64_t D) {
  const std::vector<QueryPiece> pieces = SequencePieces(cu_seqlens, num_seqs);
  const int64_t stride = (H + 2 * KV) * D;
  ContextAttentionForward(out, lse, qkv, {qkv, stride, H * D, (H + KV) * D}, pieces.data(),
                          static_cast<int64_t>(pieces.size()), H, KV, D);
}

void AttentionBackward(float* dqkv, const float* dout, const float* qkv, const float* out,
                       const float* lse, const int32_t* cu_seqlens, int64_t num_seqs, int64_t H,
                       int64_t KV, int64_t D) {
  const std::vector<QueryPiece> pieces = SequencePieces(cu_seqlens, num_seqs);
  const int64_t stride = (H + 2 * KV) * D;
  ContextAttentionBackward(dqkv, {dqkv, stride, H * D, (H + KV) * D, /*accumulate=*/false}, dout,
                           qkv, {qkv, stride, H * D, (H + KV) * D}, out, lse, pieces.data(),
                           static_cast<int64_t>(pieces.size()), H, KV, D, cu_seqlens[num_seqs]);
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
