// The fixed-order dot product behind every batch-invariant CPU kernel (ReductionOrder::
// kBatchInvariant): 8-lane partial sums over k in steps of 8, the tail zero-padded, then a fixed
// horizontal sum. A micro-kernel of R rows x C columns runs R*C of these side by side; each
// element's sequence of operations is the same whatever R and C are.
#pragma once

#include <cstdint>

#include "kernels/cpu/vec_math.h"

namespace prl::kernels::cpu {

inline F8 LoadK(const float* p, int64_t k, int64_t K) {
  return k + kVec <= K ? Load8(p + k) : LoadPartial(p + k, K - k, 0.0f);
}

// ((0+4)+(2+6)) + ((1+5)+(3+7))
inline float ReduceFixed(F8 v) {
  return ((v[0] + v[4]) + (v[2] + v[6])) + ((v[1] + v[5]) + (v[3] + v[7]));
}

// out[r * ldo + c] = dot(a row r, w row c) for r < R, c < C; rows have length K.
template <int64_t R, int64_t C>
inline void DotMicroKernel(float* out, int64_t ldo, const float* a, int64_t lda, const float* w,
                           int64_t ldw, int64_t K) {
  F8 acc[R][C] = {};
  for (int64_t k = 0; k < K; k += kVec) {
    F8 av[R], wv[C];
    for (int64_t r = 0; r < R; ++r) av[r] = LoadK(a + r * lda, k, K);
    for (int64_t c = 0; c < C; ++c) wv[c] = LoadK(w + c * ldw, k, K);
    for (int64_t r = 0; r < R; ++r) {
      for (int64_t c = 0; c < C; ++c) acc[r][c] += av[r] * wv[c];
    }
  }
  for (int64_t r = 0; r < R; ++r) {
    for (int64_t c = 0; c < C; ++c) out[r * ldo + c] = ReduceFixed(acc[r][c]);
  }
}

inline float DotInvariant(const float* a, const float* b, int64_t K) {
  float out;
  DotMicroKernel<1, 1>(&out, 1, a, K, b, K, K);
  return out;
}

// Attention of one query row, in the fixed order shared by every attention kernel that must
// agree bit for bit (the packed learner path and the paged engine path, kBatchInvariant, and
// the engine's decode rows):
//   s[j] = scale * (q[0] k_j[0] + q[1] k_j[1] + ... + q[D-1] k_j[D-1]), summed in d order,
//   p = softmax(s) via RowMax / SumExp, out = p[0] v_0 + p[1] v_1 + ... in j order.
// Keys are scored eight at a time (one lane per key), so the d-sum needs no horizontal add.

// s[j] for keys j = 0 .. n-1 stored as rows: key j at keys + j * stride.
inline void ScoreKeyRows(float* s, const float* q, const float* keys, int64_t stride, int64_t n,
                         int64_t D, float scale) {
  for (int64_t j = 0; j < n; j += kVec) {
    const int64_t lanes = n - j < kVec ? n - j : kVec;
    F8 acc = {};
    for (int64_t d = 0; d < D; ++d) {
      F8 kv = {};
      for (int64_t l = 0; l < lanes; ++l) kv[l] = keys[(j + l) * stride + d];
      acc += Splat(q[d]) * kv;
    }
    acc = acc * scale;
    lanes == kVec ? Store8(s + j, acc) : StorePartial(s + j, lanes, acc);
  }
}

// s[j] for the n keys of one transposed block: element d of key j at keys_t[d * ld + j].
inline void ScoreKeyBlockTransposed(float* s, const float* q, const float* keys_t, int64_t ld,
                                    int64_t n, int64_t D, float scale) {
  for (int64_t j = 0; j < n; j += kVec) {
    const int64_t lanes = n - j < kVec ? n - j : kVec;
    F8 acc = {};
    for (int64_t d = 0; d < D; ++d) {
      const float* k = keys_t + d * ld + j;
      acc += Splat(q[d]) * (lanes == kVec ? Load8(k) : LoadPartial(k, lanes, 0.0f));
    }
    acc = acc * scale;
    lanes == kVec ? Store8(s + j, acc) : StorePartial(s + j, lanes, acc);
  }
}

// Largest head size the row kernels support (Llama/Qwen2 use 64 or 128).
inline constexpr int64_t kMaxHeadDim = 256;

// Given scores s[0..n), writes out (D) = softmax(s) . V and returns the lse. value(j) is
// called once per key, in order, and points at D floats. s is overwritten with the
// unnormalised exponentials. Per element of out the sum runs over j in order.
template <class ValueAt>
inline float SoftmaxValueSum(float* out, float* s, int64_t n, int64_t D, ValueAt value) {
  const float row_max = RowMax(s, n);
  const double sum = SumExp</*kStore=*/true>(s, n, row_max);
  const float inv_sum = static_cast<float>(1.0 / sum);
  const int64_t chunks = (D + kVec - 1) / kVec, tail = D - (chunks - 1) * kVec;
  F8 acc[kMaxHeadDim / kVec] = {};
  for (int64_t j = 0; j < n; ++j) {
    const float* v = value(j);
    const F8 p = Splat(s[j] * inv_sum);
    for (int64_t c = 0; c + 1 < chunks; ++c) acc[c] += p * Load8(v + c * kVec);
    const float* last = v + (chunks - 1) * kVec;
    acc[chunks - 1] += p * (tail == kVec ? Load8(last) : LoadPartial(last, tail, 0.0f));
  }
  for (int64_t c = 0; c + 1 < chunks; ++c) Store8(out + c * kVec, acc[c]);
  tail == kVec ? Store8(out + (chunks - 1) * kVec, acc[chunks - 1])
               : StorePartial(out + (chunks - 1) * kVec, tail, acc[chunks - 1]);
  return LogSumExpFromSum(row_max, sum);
}

}  // namespace prl::kernels::cpu
