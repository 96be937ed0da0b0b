#include "kernels/matmul.h"

#include <gtest/gtest.h>

#include "tests/kernels/reference_ops.h"
#include "tests/kernels/tensor_util.h"

namespace prl::testing {
namespace {

constexpr int64_t M = 7, N = 5, K = 9;

TEST(MatmulTest, ForwardMatchesFloat64ReferenceWithAndWithoutBias) {
  std::mt19937_64 rng(1);
  const Vec a = RandomVec(M * K, rng), w = RandomVec(N * K, rng), bias = RandomVec(N, rng);
  for (bool with_bias : {false, true}) {
    std::vector<float> a32 = ToF32(a), w32 = ToF32(w), b32 = ToF32(bias), out(M * N, 123.0f);
    kernels::MatmulForward(View(out, {M, N}), View(a32, {M, K}), View(w32, {N, K}),
                           with_bias ? View(b32, {N}) : Tensor());
    EXPECT_LT(RelativeError(ToF64(out), MatmulRef(a, w, with_bias ? bias : Vec{}, M, N, K)), 1e-6)
        << "bias " << with_bias;
  }
}

TEST(MatmulTest, AccumulateAddsToTheOutput) {
  std::mt19937_64 rng(2);
  const Vec a = RandomVec(M * K, rng), w = RandomVec(N * K, rng), bias = RandomVec(N, rng);
  const Vec prior = RandomVec(M * N, rng);
  std::vector<float> a32 = ToF32(a), w32 = ToF32(w), b32 = ToF32(bias), out = ToF32(prior);
  kernels::MatmulForward(View(out, {M, N}), View(a32, {M, K}), View(w32, {N, K}), View(b32, {N}),
                         /*accumulate=*/true);
  Vec expected = MatmulRef(a, w, bias, M, N, K);
  for (size_t i = 0; i < expected.size(); ++i) expected[i] += prior[i];
  EXPECT_LT(RelativeError(ToF64(out), expected), 1e-6);
}

TEST(MatmulTest, BackwardMatchesFiniteDifferencesAndAccumulatesWeightGrads) {
  std::mt19937_64 rng(3);
  const Vec a = RandomVec(M * K, rng), w = RandomVec(N * K, rng), bias = RandomVec(N, rng);
  const Vec dout = RandomVec(M * N, rng);  // L = <dout, a w^T + b>
  const Vec prior_dw = RandomVec(N * K, rng), prior_db = RandomVec(N, rng);

  std::vector<float> a32 = ToF32(a), w32 = ToF32(w), dout32 = ToF32(dout);
  std::vector<float> da(M * K, 99.0f), dw = ToF32(prior_dw), db = ToF32(prior_db);
  kernels::MatmulBackward(View(da, {M, K}), View(dw, {N, K}), View(db, {N}), View(dout32, {M, N}),
                          View(a32, {M, K}), View(w32, {N, K}));

  const Vec fd_a = FiniteDifferenceGradient(
      [&](const Vec& x) { return Dot(dout, MatmulRef(x, w, bias, M, N, K)); }, a);
  Vec fd_w = FiniteDifferenceGradient(
      [&](const Vec& x) { return Dot(dout, MatmulRef(a, x, bias, M, N, K)); }, w);
  Vec fd_b = FiniteDifferenceGradient(
      [&](const Vec& x) { return Dot(dout, MatmulRef(a, w, x, M, N, K)); }, bias);
  for (size_t i = 0; i < fd_w.size(); ++i) fd_w[i] += prior_dw[i];
  for (size_t i = 0; i < fd_b.size(); ++i) fd_b[i] += prior_db[i];
  EXPECT_LT(RelativeError(ToF64(da), fd_a), 1e-6) << "da is overwritten";
  EXPECT_LT(RelativeError(ToF64(dw), fd_w), 1e-6) << "dw is accumulated";
  EXPECT_LT(RelativeError(ToF64(db), fd_b), 1e-6) << "dbias is accumulated";
}

TEST(MatmulTest, BackwardWithoutInputGradientOnlyTouchesWeights) {
  std::mt19937_64 rng(4);
  std::vector<float> a = ToF32(RandomVec(M * K, rng)), w = ToF32(RandomVec(N * K, rng));
  std::vector<float> dout = ToF32(RandomVec(M * N, rng)), dw(N * K, 0.0f);
  kernels::MatmulBackward(Tensor(), View(dw, {N, K}), Tensor(), View(dout, {M, N}), View(a, {M, K}),
                          View(w, {N, K}));
  double norm = 0.0;
  for (float x : dw) norm += x * x;
  EXPECT_GT(norm, 0.0);
}

}  // namespace
}  // namespace prl::testing
