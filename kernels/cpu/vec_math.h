// Vectorised fp32 math for the CPU kernels' hot loops (softmax, log-sum-exp, SiLU).
//
// glibc's expf is only vectorised under -ffast-math, which prl does not use (it would change
// NaN/inf semantics everywhere), and GCC turns a clamped scalar exp into branches, so the
// loops are written on 8-wide vectors (GCC/Clang vector extensions; AVX2 registers on
// x86-64-v3). FastExp8 is Cephes' expf: range reduction x = n ln2 + r, |r| <= ln2/2, and a
// degree-6 polynomial; relative error below 2 ulp on [-87, 88] (tests/kernels/
// vec_math_test.cc), 0 below about -87.3 (no denormals), finite above 88.37.
//
// Every element goes through the same vector code, tails included (they are padded), so a
// value never depends on where in a row it sits or how long the row is.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

namespace prl::kernels::cpu {

using F8 = float __attribute__((vector_size(32)));
using I8 = int32_t __attribute__((vector_size(32)));
inline constexpr int64_t kVec = 8;

inline F8 Splat(float v) { return F8{} + v; }

inline F8 Load8(const float* p) {
  F8 v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
inline void Store8(float* p, F8 v) { std::memcpy(p, &v, sizeof(v)); }
// The first n (< 8) elements of p; the other lanes are `fill`.
inline F8 LoadPartial(const float* p, int64_t n, float fill) {
  F8 v = Splat(fill);
  for (int64_t k = 0; k < n; ++k) v[k] = p[k];
  return v;
}
inline void StorePartial(float* p, int64_t n, F8 v) {
  for (int64_t k = 0; k < n; ++k) p[k] = v[k];
}

inline F8 FastExp8(F8 x) {
  const F8 hi = Splat(88.3762626647949f);
  x = x > hi ? hi : x;
  x = x < -hi ? -hi : x;
  // n = floor(x log2(e) + 1/2), from a truncating conversion corrected for negatives.
  const F8 t = x * 1.44269504088896341f + 0.5f;
  I8 n = __builtin_convertvector(t, I8);
  F8 nf = __builtin_convertvector(n, F8);
  const I8 too_big = nf > t;  // all-ones (-1) where truncation rounded up
  n += too_big;
  nf = __builtin_convertvector(n, F8);
  // r = x - n ln2, with ln2 split so that n * ln2_hi is exact.
  F8 r = x - nf * 0.693359375f;
  r = r - nf * -2.12194440e-4f;
  F8 p = Splat(1.9875691500e-4f);
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  // 2^n through the exponent bits; n = -127 (x near the lower clamp) gives +0.
  const I8 bits = (n + 127) << 23;
  F8 scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return p * scale;
}

inline F8 Max8(F8 a, F8 b) { return a > b ? a : b; }

inline double HorizontalSum(F8 v) {
  double s = 0.0;
  for (int64_t k = 0; k < kVec; ++k) s += v[k];
  return s;
}

// max(z[0..n)); -inf for n = 0.
inline float RowMax(const float* z, int64_t n) {
  F8 m = Splat(-std::numeric_limits<float>::infinity());
  int64_t i = 0;
  for (; i + kVec <= n; i += kVec) m = Max8(m, Load8(z + i));
  if (i < n) m = Max8(m, LoadPartial(z + i, n - i, -std::numeric_limits<float>::infinity()));
  float best = m[0];
  for (int64_t k = 1; k < kVec; ++k) best = best > m[k] ? best : m[k];
  return best;
}

// sum_i exp(z[i] - shift), accumulated in fp32 lanes over blocks of 1024 elements and in
// double across blocks; with kStore, also z[i] = exp(z[i] - shift).
template <bool kStore>
inline double SumExp(float* z, int64_t n, float shift) {
  constexpr int64_t kBlock = 1024;
  const F8 s = Splat(shift);
  double total = 0.0;
  F8 acc = {};
  int64_t i = 0;
  for (; i + kVec <= n; i += kVec) {
    const F8 e = FastExp8(Load8(z + i) - s);
    if constexpr (kStore) Store8(z + i, e);
    acc += e;
    if ((i + kVec) % kBlock == 0) {
      total += HorizontalSum(acc);
      acc = F8{};
    }
  }
  if (i < n) {
    // Padding lanes hold -inf: exp gives 0 there.
    const F8 e = FastExp8(LoadPartial(z + i, n - i, -std::numeric_limits<float>::infinity()) - s);
    if constexpr (kStore) StorePartial(z + i, n - i, e);
    acc += e;
  }
  return total + HorizontalSum(acc);
}

// sum_i exp(z[i] - lse) * z[i]: the mean of z under softmax(z), given the row's log-sum-exp
// (a softmax entropy is lse minus it); accumulated as SumExp does.
inline double SoftmaxMean(const float* z, int64_t n, float lse) {
  constexpr int64_t kBlock = 1024;
  const F8 s = Splat(lse);
  double total = 0.0;
  F8 acc = {};
  int64_t i = 0;
  for (; i + kVec <= n; i += kVec) {
    const F8 x = Load8(z + i);
    acc += FastExp8(x - s) * x;
    if ((i + kVec) % kBlock == 0) {
      total += HorizontalSum(acc);
      acc = F8{};
    }
  }
  if (i < n) {  // padding lanes: exp(-inf) = 0 times z = 0
    const F8 e = FastExp8(LoadPartial(z + i, n - i, -std::numeric_limits<float>::infinity()) - s);
    acc += e * LoadPartial(z + i, n - i, 0.0f);
  }
  return total + HorizontalSum(acc);
}

// out[i] = scale * exp(z[i] - shift), elementwise (may alias).
inline void ScaledExp(float* out, const float* z, int64_t n, float shift, float scale) {
  const F8 s = Splat(shift);
  int64_t i = 0;
  for (; i + kVec <= n; i += kVec) Store8(out + i, FastExp8(Load8(z + i) - s) * scale);
  if (i < n) StorePartial(out + i, n - i, FastExp8(LoadPartial(z + i, n - i, 0.0f) - s) * scale);
}

// The log-sum-exp of a row from its max and SumExp: the one formula shared by the learner's
// log-probabilities and the sampler's behaviour log-probabilities.
inline float LogSumExpFromSum(float row_max, double sum_exp) {
  return row_max + static_cast<float>(std::log(sum_exp));
}

// log sum_i exp(z[i]); z is not modified.
inline float RowLogSumExp(float* z, int64_t n) {
  const float row_max = RowMax(z, n);
  return LogSumExpFromSum(row_max, SumExp</*kStore=*/false>(z, n, row_max));
}

inline F8 Sigmoid8(F8 x) { return 1.0f / (1.0f + FastExp8(-x)); }

}  // namespace prl::kernels::cpu
