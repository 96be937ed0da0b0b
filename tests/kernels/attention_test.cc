#include "kernels/attention.h"

#include <gtest/gtest.h>

#include <cstring>

#include "tests/kernels/reference_ops.h"
#include "tests/kernels/tensor_util.h"

namespace prl::testing {
namespace {

struct Packed {
  std::vector<int32_t> cu_seqlens;
  int64_t T;
};

Packed Pack(std::initializer_list<int32_t> lens) {
  Packed p{{0}, 0};
  for (int32_t len : lens) p.cu_seqlens.push_back(p.cu_seqlens.back() + len);
  p.T = p.cu_seqlens.back();
  return p;
}

struct Forward {
  std::vector<float> out, lse;
};

Forward RunForward(std::vector<float>& qkv, Packed& p, int64_t H, int64_t KV, int64_t D) {
  Forward f{std::vector<float>(p.T * H * D, -7.0f), std::vector<float>(p.T * H, -7.0f)};
  kernels::AttentionForward(
      View(f.out, {p.T, H * D}), View(f.lse, {p.T, H}), View(qkv, {p.T, (H + 2 * KV) * D}),
      View(p.cu_seqlens, {static_cast<int64_t>(p.cu_seqlens.size())}), {H, KV, D});
  return f;
}

// Lengths straddle the kernel's 64-row query blocks; H/KV = 3 exercises GQA.
TEST(AttentionTest, ForwardMatchesFloat64ReferenceOverPackedSequences) {
  constexpr int64_t H = 6, KV = 2, D = 16;
  Packed p = Pack({1, 5, 64, 65, 130});
  std::mt19937_64 rng(9);
  const Vec qkv = RandomVec(p.T * (H + 2 * KV) * D, rng);
  std::vector<float> qkv32 = ToF32(qkv);
  const Forward f = RunForward(qkv32, p, H, KV, D);
  EXPECT_LT(RelativeError(ToF64(f.out), AttentionRef(qkv, p.cu_seqlens, H, KV, D)), 1e-6);
}

TEST(AttentionTest, SequencesInOnePackDoNotSeeEachOther) {
  constexpr int64_t H = 2, KV = 1, D = 8, W = (H + 2 * KV) * D;
  Packed p = Pack({9, 70});
  std::mt19937_64 rng(10);
  std::vector<float> qkv = ToF32(RandomVec(p.T * W, rng));
  const Forward before = RunForward(qkv, p, H, KV, D);
  for (int64_t i = 0; i < 9 * W; ++i) qkv[i] += 1.0f;  // change sequence 0 only
  const Forward after = RunForward(qkv, p, H, KV, D);
  for (int64_t i = 9 * H * D; i < p.T * H * D; ++i) ASSERT_EQ(before.out[i], after.out[i]) << i;
}

TEST(AttentionTest, LogSumExpIsThatOfTheScaledScores) {
  constexpr int64_t H = 1, KV = 1, D = 4, W = 3 * D;
  Packed p = Pack({3});
  std::mt19937_64 rng(11);
  std::vector<float> qkv = ToF32(RandomVec(p.T * W, rng));
  const Forward f = RunForward(qkv, p, H, KV, D);
  for (int64_t i = 0; i < p.T; ++i) {
    double z = 0.0;
    for (int64_t j = 0; j <= i; ++j) {
      double s = 0.0;
      for (int64_t d = 0; d < D; ++d) s += double{qkv[i * W + d]} * qkv[j * W + D + d];
      z += std::exp(s / 2.0);  // 1/sqrt(D) = 1/2
    }
    EXPECT_NEAR(f.lse[i], std::log(z), 1e-5);
  }
}

TEST(AttentionTest, BackwardMatchesFiniteDifferences) {
  constexpr int64_t H = 4, KV = 2, D = 4, W = (H + 2 * KV) * D;
  Packed p = Pack({1, 3, 66});  // 66 crosses a query-block boundary
  std::mt19937_64 rng(12);
  const Vec qkv = RandomVec(p.T * W, rng), dout = RandomVec(p.T * H * D, rng);
  std::vector<float> qkv32 = ToF32(qkv), dout32 = ToF32(dout);
  const Forward f = RunForward(qkv32, p, H, KV, D);
  std::vector<float> dqkv(p.T * W, 55.0f);
  kernels::AttentionBackward(
      View(dqkv, {p.T, W}), View(dout32, {p.T, H * D}), View(qkv32, {p.T, W}),
      View(const_cast<std::vector<float>&>(f.out), {p.T, H * D}),
      View(const_cast<std::vector<float>&>(f.lse), {p.T, H}), View(p.cu_seqlens, {4}), {H, KV, D});
  const Vec fd = FiniteDifferenceGradient(
      [&](const Vec& v) { return Dot(dout, AttentionRef(v, p.cu_seqlens, H, KV, D)); }, qkv);
  EXPECT_LT(RelativeError(ToF64(dqkv), fd), 1e-5);
}

// The reduction order over the heads of a KV group is fixed, so thread timing cannot change
// a single bit (resumed training must replay bit for bit).
TEST(AttentionTest, BackwardIsBitwiseDeterministic) {
  constexpr int64_t H = 8, KV = 2, D = 8, W = (H + 2 * KV) * D;
  Packed p = Pack({100, 37, 80});
  std::mt19937_64 rng(13);
  std::vector<float> qkv = ToF32(RandomVec(p.T * W, rng)),
                     dout = ToF32(RandomVec(p.T * H * D, rng));
  Forward f = RunForward(qkv, p, H, KV, D);
  std::vector<float> first(p.T * W), second(p.T * W);
  for (std::vector<float>* dqkv : {&first, &second}) {
    kernels::AttentionBackward(View(*dqkv, {p.T, W}), View(dout, {p.T, H * D}), View(qkv, {p.T, W}),
                               View(f.out, {p.T, H * D}), View(f.lse, {p.T, H}),
                               View(p.cu_seqlens, {4}), {H, KV, D});
  }
  EXPECT_EQ(std::memcmp(first.data(), second.data(), first.size() * sizeof(float)), 0);
}

}  // namespace
}  // namespace prl::testing
