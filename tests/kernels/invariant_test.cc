// Batch-invariant kernels (ReductionOrder::kBatchInvariant): correct, and each row's bits
// independent of how many rows are computed with it and where it sits.
#include <gtest/gtest.h>

#include <cstring>

#include "kernels/attention.h"
#include "kernels/matmul.h"
#include "tests/kernels/reference_ops.h"
#include "tests/kernels/tensor_util.h"

namespace prl::testing {
namespace {

using kernels::ReductionOrder;

TEST(InvariantMatmulTest, MatchesFloat64ReferenceWithBiasAndAccumulate) {
  constexpr int64_t M = 9, N = 7, K = 21;  // not multiples of the 4x2 tile or of 8 lanes
  std::mt19937_64 rng(20);
  const Vec a = RandomVec(M * K, rng), w = RandomVec(N * K, rng), bias = RandomVec(N, rng);
  const Vec prior = RandomVec(M * N, rng);
  std::vector<float> a32 = ToF32(a), w32 = ToF32(w), b32 = ToF32(bias), out = ToF32(prior);
  kernels::MatmulForward(View(out, {M, N}), View(a32, {M, K}), View(w32, {N, K}), View(b32, {N}),
                         /*accumulate=*/true, ReductionOrder::kBatchInvariant);
  Vec expected = MatmulRef(a, w, bias, M, N, K);
  for (size_t i = 0; i < expected.size(); ++i) expected[i] += prior[i];
  EXPECT_LT(RelativeError(ToF64(out), expected), 1e-6);
}

TEST(InvariantMatmulTest, RowBitsDoNotDependOnBatchSizeOrPosition) {
  constexpr int64_t N = 300, K = 133;
  std::mt19937_64 rng(21);
  std::vector<float> w = ToF32(RandomVec(N * K, rng)), row = ToF32(RandomVec(K, rng));
  std::vector<float> alone(N);
  kernels::MatmulForward(View(alone, {1, N}), View(row, {1, K}), View(w, {N, K}), {}, false,
                         ReductionOrder::kBatchInvariant);
  for (int64_t M : {2, 3, 5, 64, 257}) {
    for (int64_t position : {int64_t{0}, M / 2, M - 1}) {
      std::vector<float> a = ToF32(RandomVec(M * K, rng)), out(M * N);
      std::memcpy(a.data() + position * K, row.data(), K * sizeof(float));
      kernels::MatmulForward(View(out, {M, N}), View(a, {M, K}), View(w, {N, K}), {}, false,
                             ReductionOrder::kBatchInvariant);
      ASSERT_EQ(std::memcmp(out.data() + position * N, alone.data(), N * sizeof(float)), 0)
          << "M=" << M << " position=" << position;
    }
  }
}

TEST(InvariantAttentionTest, MatchesFloat64ReferenceAndIsPackingInvariant) {
  constexpr int64_t H = 4, KV = 2, D = 12, W = (H + 2 * KV) * D;
  std::vector<int32_t> cu = {0, 1, 40, 110};
  const int64_t T = cu.back();
  std::mt19937_64 rng(22);
  const Vec qkv = RandomVec(T * W, rng);
  std::vector<float> qkv32 = ToF32(qkv), out(T * H * D), lse(T * H);
  kernels::AttentionForward(View(out, {T, H * D}), View(lse, {T, H}), View(qkv32, {T, W}),
                            View(cu, {4}), {H, KV, D}, ReductionOrder::kBatchInvariant);
  EXPECT_LT(RelativeError(ToF64(out), AttentionRef(qkv, cu, H, KV, D)), 1e-6);

  // The last sequence alone gives the same bits as inside the pack.
  std::vector<int32_t> cu_alone = {0, 70};
  std::vector<float> qkv_alone(qkv32.begin() + 40 * W, qkv32.end()), out_alone(70 * H * D),
      lse_alone(70 * H);
  kernels::AttentionForward(View(out_alone, {70, H * D}), View(lse_alone, {70, H}),
                            View(qkv_alone, {70, W}), View(cu_alone, {2}), {H, KV, D},
                            ReductionOrder::kBatchInvariant);
  EXPECT_EQ(std::memcmp(out_alone.data(), out.data() + 40 * H * D, out_alone.size() * 4), 0);
  EXPECT_EQ(std::memcmp(lse_alone.data(), lse.data() + 40 * H, lse_alone.size() * 4), 0);
}

}  // namespace
}  // namespace prl::testing
