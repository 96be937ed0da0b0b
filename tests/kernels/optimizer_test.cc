// The optimizer kernels against float64 re-statements of torch.optim.AdamW / SGD.
#include "kernels/optimizer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

namespace prl::kernels {
namespace {

Tensor View(std::vector<float>& v) {
  return Tensor(v.data(), DType::kF32, Device::Cpu(), {static_cast<int64_t>(v.size())});
}

std::vector<float> Random(size_t n, uint64_t seed, float scale) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// torch.optim.AdamW, one parameter, float64.
struct AdamW64 {
  double p, m = 0, v = 0;
  void Step(double g, const AdamWStep& s, int64_t t, bool decay) {
    g *= s.grad_scale;
    if (decay) p *= 1.0 - double{s.lr} * s.weight_decay;
    m = s.beta1 * m + (1.0 - s.beta1) * g;
    v = s.beta2 * v + (1.0 - s.beta2) * g * g;
    const double bc1 = 1.0 - std::pow(double{s.beta1}, t), bc2 = 1.0 - std::pow(double{s.beta2}, t);
    p -= s.lr / bc1 * m / (std::sqrt(v) / std::sqrt(bc2) + s.eps);
  }
};

TEST(OptimizerKernelTest, AdamWFollowsTorchOverSeveralStepsWithDecayOnlyInItsRange) {
  const size_t n = 10'000;
  std::vector<float> p = Random(n, 1, 0.5f), m(n, 0.0f), v(n, 0.0f);
  std::vector<AdamW64> ref(n);
  for (size_t i = 0; i < n; ++i) ref[i].p = p[i];
  AdamWStep s;
  s.lr = 1e-2f;
  s.weight_decay = 0.1f;
  s.grad_scale = 0.5f;
  const int64_t decay_begin = 2500, decay_end = 7000;
  for (int64_t t = 1; t <= 5; ++t) {
    std::vector<float> g = Random(n, 100 + t, 1e-2f);
    s.step = t;
    AdamWUpdate(View(p), View(g), View(m), View(v), 0, decay_begin, false, s);
    AdamWUpdate(View(p), View(g), View(m), View(v), decay_begin, decay_end, true, s);
    AdamWUpdate(View(p), View(g), View(m), View(v), decay_end, n, false, s);
    for (size_t i = 0; i < n; ++i) {
      const bool decay =
          static_cast<int64_t>(i) >= decay_begin && static_cast<int64_t>(i) < decay_end;
      ref[i].Step(g[i], s, t, decay);
    }
  }
  // fp32 arithmetic on values of magnitude ~0.5 and updates of ~lr: a few ulps of the weight.
  for (size_t i = 0; i < n; ++i) ASSERT_NEAR(p[i], ref[i].p, 1e-6) << i;
}

TEST(OptimizerKernelTest, AdamWOutsideTheRangeLeavesEverythingUntouched) {
  std::vector<float> p(100, 1.0f), g(100, 1.0f), m(100, 0.0f), v(100, 0.0f);
  AdamWStep s;
  s.lr = 0.1f;
  AdamWUpdate(View(p), View(g), View(m), View(v), 10, 20, false, s);
  for (int i = 0; i < 100; ++i) {
    const bool inside = i >= 10 && i < 20;
    EXPECT_EQ(p[i] != 1.0f, inside) << i;
    EXPECT_EQ(m[i] != 0.0f, inside) << i;
  }
}

TEST(OptimizerKernelTest, AdamWWithBf16CopyEqualsAdamWThenRoundingInItsRangeOnly) {
  const size_t n = 1000;
  const std::vector<float> p0 = Random(n, 7, 0.5f), g = Random(n, 8, 1.0f);
  AdamWStep s;
  s.lr = 1e-2f;
  s.weight_decay = 0.1f;
  s.step = 3;
  std::vector<float> p1 = p0, m1(n, 0.1f), v1(n, 0.2f), g1 = g;
  AdamWUpdate(View(p1), View(g1), View(m1), View(v1), 100, 900, true, s);
  std::vector<float> p2 = p0, m2(n, 0.1f), v2(n, 0.2f), g2 = g;
  std::vector<uint16_t> copy(n, 0x7fc0);  // NaN outside the range stays NaN
  AdamWUpdateWithBf16Copy(View(p2), View(g2), View(m2), View(v2),
                          Tensor(copy.data(), DType::kBF16, Device::Cpu(), {1000}), 100, 900, true,
                          s);
  EXPECT_EQ(p1, p2);
  EXPECT_EQ(m1, m2);
  EXPECT_EQ(v1, v2);
  for (size_t i = 0; i < n; ++i) {
    const bool in_range = i >= 100 && i < 900;
    ASSERT_EQ(copy[i], in_range ? F32ToBf16(p2[i]) : uint16_t{0x7fc0}) << i;
  }
}

TEST(OptimizerKernelTest, SgdIsPMinusLrTimesScaledGradientPlusDecay) {
  std::vector<float> p = Random(1000, 3, 1.0f), g = Random(1000, 4, 1.0f);
  const std::vector<float> p0 = p;
  SgdUpdate(View(p), View(g), 0, 500, true, 0.1f, 0.01f, 0.5f);
  SgdUpdate(View(p), View(g), 500, 1000, false, 0.1f, 0.01f, 0.5f);
  for (size_t i = 0; i < p.size(); ++i) {
    const double expected = p0[i] - 0.1 * (0.5 * g[i] + (i < 500 ? 0.01 * p0[i] : 0.0));
    ASSERT_NEAR(p[i], expected, 1e-6) << i;
  }
}

TEST(OptimizerKernelTest, SumOfSquaresIsAFloat64SumIndependentOfThreads) {
  std::vector<float> x = Random(100'003, 5, 3.0f);
  double expected = 0;
  for (float v : x) expected += double{v} * v;
  const double got = SumOfSquares(View(x));
  EXPECT_NEAR(got, expected, 1e-12 * expected);
}

TEST(OptimizerKernelTest, AddInPlaceAddsElementwise) {
  std::vector<float> a = Random(777, 6, 1.0f), b = Random(777, 7, 1.0f);
  const std::vector<float> a0 = a;
  AddInPlace(View(a), View(b));
  for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(a[i], a0[i] + b[i]);
}

}  // namespace
}  // namespace prl::kernels
