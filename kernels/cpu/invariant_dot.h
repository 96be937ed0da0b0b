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

// One query row against keys/values 0 .. visible-1, in that order: scores, softmax, weighted
// sum. key(j) and value(j) return pointers to D floats. out (D) =, returns the row's lse.
// `scores` holds >= visible floats. Packed (learner) and paged (engine) attention both call
// this, so in batch-invariant mode they agree bit for bit.
template <class KeyAt, class ValueAt>
inline float AttendRowInvariant(float* out, const float* q, KeyAt key, ValueAt value,
                                int64_t visible, int64_t D, float scale, float* scores) {
  for (int64_t j = 0; j < visible; ++j) scores[j] = DotInvariant(q, key(j), D) * scale;
  const float row_max = RowMax(scores, visible);
  const double sum = SumExp</*kStore=*/true>(scores, visible, row_max);
  const float inv_sum = static_cast<float>(1.0 / sum);
  for (int64_t d = 0; d < D; d += kVec) {
    const int64_t n = D - d < kVec ? D - d : kVec;
    F8 acc = {};
    for (int64_t j = 0; j < visible; ++j) {
      const float* v = value(j) + d;
      acc += (scores[j] * inv_sum) * (n == kVec ? Load8(v) : LoadPartial(v, n, 0.0f));
    }
    n == kVec ? Store8(out + d, acc) : StorePartial(out + d, n, acc);
  }
  return LogSumExpFromSum(row_max, sum);
}

}  // namespace prl::kernels::cpu
