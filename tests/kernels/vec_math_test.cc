#include "kernels/cpu/vec_math.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace prl::kernels::cpu {
namespace {

float Exp(float x) { return FastExp8(Splat(x))[0]; }

// Relative error in units of float epsilon, against the float64 exponential.
TEST(VecMathTest, FastExpIsWithinTwoUlpOverTheNormalRange) {
  double worst = 0.0;
  float worst_x = 0.0f;
  for (float x = -87.0f; x <= 88.0f; x += 0.000731f) {
    const double exact = std::exp(static_cast<double>(x));
    const double err = std::abs(Exp(x) - exact) / exact / std::numeric_limits<float>::epsilon();
    if (err > worst) {
      worst = err;
      worst_x = x;
    }
  }
  EXPECT_LT(worst, 2.0) << "at x = " << worst_x;
}

TEST(VecMathTest, FastExpSaturatesInsteadOfOverflowingOrProducingNaN) {
  EXPECT_EQ(Exp(-1000.0f), 0.0f);
  EXPECT_EQ(Exp(-std::numeric_limits<float>::infinity()), 0.0f);
  EXPECT_TRUE(std::isfinite(Exp(1000.0f)));
  EXPECT_GT(Exp(1000.0f), 1e38f);
  EXPECT_EQ(Exp(0.0f), 1.0f);
  EXPECT_NEAR(Sigmoid8(Splat(-200.0f))[0], 0.0f, 1e-38f);
  EXPECT_EQ(Sigmoid8(Splat(200.0f))[0], 1.0f);
}

TEST(VecMathTest, RowReductionsMatchFloat64OverLongRowsWithTails) {
  for (size_t n : {size_t{1}, size_t{7}, size_t{8}, size_t{1025}, size_t{151937}}) {
    std::vector<float> z(n);
    for (size_t i = 0; i < n; ++i) z[i] = std::sin(0.37 * i) * 20.0f;
    double max64 = -1e300, sum64 = 0.0;
    for (float v : z) max64 = std::max(max64, double{v});
    for (float v : z) sum64 += std::exp(v - max64);
    const float m = RowMax(z.data(), n);
    EXPECT_EQ(m, static_cast<float>(max64)) << n;
    EXPECT_NEAR(SumExp<false>(z.data(), n, m) / sum64, 1.0, 1e-6) << n;
    std::vector<float> stored = z;
    EXPECT_NEAR(SumExp<true>(stored.data(), n, m) / sum64, 1.0, 1e-6) << n;
    std::vector<float> scaled(n);
    ScaledExp(scaled.data(), z.data(), n, m, -2.0f);
    for (size_t i = 0; i < n; ++i) {
      const double e = std::exp(double{z[i] - m});  // the fp32 difference is the input
      ASSERT_NEAR(stored[i], e, 1e-6 * e) << n << " " << i;
      ASSERT_EQ(scaled[i], -2.0f * stored[i]) << "one code path for every element";
    }
  }
  EXPECT_EQ(RowMax(nullptr, 0), -std::numeric_limits<float>::infinity());
}

}  // namespace
}  // namespace prl::kernels::cpu
