#include <gtest/gtest.h>

#include "kernels/rmsnorm.h"
#include "kernels/rope.h"
#include "tests/kernels/reference_ops.h"
#include "tests/kernels/tensor_util.h"

namespace prl::testing {
namespace {

TEST(RmsNormTest, ForwardMatchesFloat64Reference) {
  constexpr int64_t T = 6, C = 40;
  std::mt19937_64 rng(5);
  const Vec x = RandomVec(T * C, rng, 3.0), w = RandomVec(C, rng);
  std::vector<float> x32 = ToF32(x), w32 = ToF32(w), y(T * C), rstd(T);
  kernels::RmsNormForward(View(y, {T, C}), View(rstd, {T}), View(x32, {T, C}), View(w32, {C}),
                          1e-6f);
  EXPECT_LT(RelativeError(ToF64(y), RmsNormRef(x, w, T, C, 1e-6)), 1e-6);
}

TEST(RmsNormTest, BackwardMatchesFiniteDifferencesAndAccumulates) {
  constexpr int64_t T = 5, C = 12;
  constexpr double kEps = 1e-5;
  std::mt19937_64 rng(6);
  const Vec x = RandomVec(T * C, rng), w = RandomVec(C, rng), dy = RandomVec(T * C, rng);
  const Vec prior_dx = RandomVec(T * C, rng), prior_dw = RandomVec(C, rng);
  std::vector<float> x32 = ToF32(x), w32 = ToF32(w), dy32 = ToF32(dy), y(T * C), rstd(T);
  kernels::RmsNormForward(View(y, {T, C}), View(rstd, {T}), View(x32, {T, C}), View(w32, {C}),
                          kEps);
  std::vector<float> dx = ToF32(prior_dx), dw = ToF32(prior_dw);
  kernels::RmsNormBackward(View(dx, {T, C}), View(dw, {C}), View(dy32, {T, C}), View(x32, {T, C}),
                           View(w32, {C}), View(rstd, {T}));
  Vec fd_x = FiniteDifferenceGradient(
      [&](const Vec& v) { return Dot(dy, RmsNormRef(v, w, T, C, kEps)); }, x);
  Vec fd_w = FiniteDifferenceGradient(
      [&](const Vec& v) { return Dot(dy, RmsNormRef(x, v, T, C, kEps)); }, w);
  for (size_t i = 0; i < fd_x.size(); ++i) fd_x[i] += prior_dx[i];
  for (size_t i = 0; i < fd_w.size(); ++i) fd_w[i] += prior_dw[i];
  EXPECT_LT(RelativeError(ToF64(dx), fd_x), 1e-5);
  EXPECT_LT(RelativeError(ToF64(dw), fd_w), 1e-5);
}

// RoPE tables as transformers computes them: fp32 inv_freq * fp32 position, cos/sin of that.
TEST(RopeTest, TablesUseTheFp32AngleOfTransformers) {
  std::vector<int32_t> positions = {0, 1, 7, 4095, 31000};
  std::vector<float> inv_freq = {1.0f, 0.1f, 0.0133352f, 1.0e-4f};
  const int64_t T = positions.size(), half = inv_freq.size();
  std::vector<float> cos(T * half), sin(T * half);
  kernels::RopeTables(View(cos, {T, half}), View(sin, {T, half}), View(positions, {T}),
                      View(inv_freq, {half}));
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t i = 0; i < half; ++i) {
      const float angle = static_cast<float>(positions[t]) * inv_freq[i];
      EXPECT_FLOAT_EQ(cos[t * half + i], static_cast<float>(std::cos(double{angle})));
      EXPECT_FLOAT_EQ(sin[t * half + i], static_cast<float>(std::sin(double{angle})));
    }
  }
}

struct RopeCase {
  int64_t T = 4, num_heads = 3, D = 8, W = 3 * 8 + 8;  // one extra untouched head
  std::vector<float> cos, sin;
  std::vector<double> cos64, sin64;

  explicit RopeCase(std::mt19937_64& rng) {
    std::uniform_real_distribution<double> angle(-3.0, 3.0);
    for (int64_t k = 0; k < T * D / 2; ++k) {
      const double a = angle(rng);
      cos.push_back(std::cos(a));
      sin.push_back(std::sin(a));
      cos64.push_back(cos.back());
      sin64.push_back(sin.back());
    }
  }
};

TEST(RopeTest, ForwardMatchesReferenceAndLeavesOtherColumnsAlone) {
  std::mt19937_64 rng(7);
  RopeCase rc(rng);
  const Vec x = RandomVec(rc.T * rc.W, rng);
  std::vector<float> x32 = ToF32(x);
  kernels::RopeApply(View(x32, {rc.T, rc.W}), rc.num_heads, rc.D, View(rc.cos, {rc.T, rc.D / 2}),
                     View(rc.sin, {rc.T, rc.D / 2}), false);
  const Vec expected = RopeRef(x, rc.cos64, rc.sin64, rc.T, rc.W, rc.num_heads, rc.D);
  EXPECT_LT(RelativeError(ToF64(x32), expected), 1e-6);
  for (int64_t t = 0; t < rc.T; ++t) {
    for (int64_t c = rc.num_heads * rc.D; c < rc.W; ++c) {
      EXPECT_EQ(x32[t * rc.W + c], static_cast<float>(x[t * rc.W + c]));
    }
  }
}

TEST(RopeTest, InverseIsTheBackwardOfTheForward) {
  std::mt19937_64 rng(8);
  RopeCase rc(rng);
  const Vec x = RandomVec(rc.T * rc.W, rng), dy = RandomVec(rc.T * rc.W, rng);
  std::vector<float> dx = ToF32(dy);
  kernels::RopeApply(View(dx, {rc.T, rc.W}), rc.num_heads, rc.D, View(rc.cos, {rc.T, rc.D / 2}),
                     View(rc.sin, {rc.T, rc.D / 2}), /*inverse=*/true);
  const Vec fd = FiniteDifferenceGradient(
      [&](const Vec& v) {
        return Dot(dy, RopeRef(v, rc.cos64, rc.sin64, rc.T, rc.W, rc.num_heads, rc.D));
      },
      x);
  EXPECT_LT(RelativeError(ToF64(dx), fd), 1e-6);
}

}  // namespace
}  // namespace prl::testing
