#include <gtest/gtest.h>

#include "kernels/embedding.h"
#include "kernels/swiglu.h"
#include "tests/kernels/reference_ops.h"
#include "tests/kernels/tensor_util.h"

namespace prl::testing {
namespace {

TEST(SwiGluTest, ForwardMatchesFloat64Reference) {
  constexpr int64_t T = 5, I = 11;
  std::mt19937_64 rng(14);
  const Vec gate_up = RandomVec(T * 2 * I, rng, 3.0);
  std::vector<float> gu = ToF32(gate_up), act(T * I);
  kernels::SwiGluForward(View(act, {T, I}), View(gu, {T, 2 * I}));
  EXPECT_LT(RelativeError(ToF64(act), SwiGluRef(gate_up, T, I)), 1e-6);
}

TEST(SwiGluTest, BackwardMatchesFiniteDifferences) {
  constexpr int64_t T = 4, I = 7;
  std::mt19937_64 rng(15);
  const Vec gate_up = RandomVec(T * 2 * I, rng, 3.0), dact = RandomVec(T * I, rng);
  std::vector<float> gu = ToF32(gate_up), da = ToF32(dact), dgu(T * 2 * I, 3.0f);
  kernels::SwiGluBackward(View(dgu, {T, 2 * I}), View(da, {T, I}), View(gu, {T, 2 * I}));
  const Vec fd = FiniteDifferenceGradient(
      [&](const Vec& v) { return Dot(dact, SwiGluRef(v, T, I)); }, gate_up);
  EXPECT_LT(RelativeError(ToF64(dgu), fd), 1e-6);
}

TEST(EmbeddingTest, ForwardGathersRows) {
  constexpr int64_t V = 6, C = 3, T = 4;
  std::vector<float> table(V * C);
  for (size_t i = 0; i < table.size(); ++i) table[i] = static_cast<float>(i);
  std::vector<int32_t> tokens = {5, 0, 5, 2};
  std::vector<float> out(T * C);
  kernels::EmbeddingForward(View(out, {T, C}), View(table, {V, C}), View(tokens, {T}));
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t c = 0; c < C; ++c) EXPECT_EQ(out[t * C + c], table[tokens[t] * C + c]);
  }
}

TEST(EmbeddingTest, BackwardAccumulatesRepeatedTokens) {
  constexpr int64_t V = 5, C = 70, T = 4;  // C > one 64-column block
  std::mt19937_64 rng(16);
  const Vec dout = RandomVec(T * C, rng), prior = RandomVec(V * C, rng);
  std::vector<int32_t> tokens = {3, 1, 3, 3};
  std::vector<float> d32 = ToF32(dout), dtable = ToF32(prior);
  kernels::EmbeddingBackward(View(dtable, {V, C}), View(d32, {T, C}), View(tokens, {T}));
  Vec expected = prior;
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t c = 0; c < C; ++c) expected[tokens[t] * C + c] += dout[t * C + c];
  }
  EXPECT_LT(RelativeError(ToF64(dtable), expected), 1e-6);
}

}  // namespace
}  // namespace prl::testing
