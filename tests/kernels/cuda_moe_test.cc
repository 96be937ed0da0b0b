// Qwen3-MoE's CUDA kernels (kernels/cuda/moe.h) against host references of model/moe_layer.h's
// math: the router's softmax, its top-k with ties to the lower expert id and the
// renormalisation; the row gather (exact); the grouped GEMM over uneven expert row ranges
// (empty experts included), F32 and BF16, and bit for bit the same row whatever other rows its
// expert has (the batch-invariant order); the weighted combine. Skips without a GPU
// (scripts/gpu_check.sh runs it); the kernels stay off (MoeCudaKernelsEnabled) until it passes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "tests/kernels/cuda_test_util.h"

#if PRL_WITH_CUDA
#include "kernels/cuda/moe.h"
#endif

namespace prl::kernels {
namespace {

using testing::AsStored;
using testing::Random;
using testing::RelativeError;

#if PRL_WITH_CUDA
using testing::DeviceTensor;

std::vector<int32_t> AsInts(const std::vector<float>& v) {
  return std::vector<int32_t>(v.begin(), v.end());
}

// Host reference: the K largest of p, by decreasing p, ties to the lower id.
std::vector<int32_t> TopK(const float* p, int64_t E, int64_t K) {
  std::vector<int32_t> ids(E);
  for (int64_t e = 0; e < E; ++e) ids[e] = static_cast<int32_t>(e);
  std::stable_sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) { return p[a] > p[b]; });
  ids.resize(K);
  return ids;
}

class CudaMoeRouteTest : public ::testing::TestWithParam<std::tuple<int, int, bool>> {};

TEST_P(CudaMoeRouteTest, SoftmaxTopKWithTiesToTheLowerIdAndRenormalisation) {
  PRL_SKIP_WITHOUT_GPU();
  const auto [E, K, renormalise] = GetParam();
  const int64_t T = 37;
  std::vector<float> logits = Random(T * E, 11, 2.0f);
  // Rows with ties: equal logits for pairs of experts, and a row of all-equal logits.
  for (int64_t e = 0; e + 1 < E; e += 2) logits[3 * E + e + 1] = logits[3 * E + e];
  for (int64_t e = 0; e < E; ++e) logits[5 * E + e] = 0.25f;
  DeviceTensor glogits(DType::kF32, {T, E}), gprobs(DType::kF32, {T, E});
  DeviceTensor groutes(DType::kI32, {T, K}), gweights(DType::kF32, {T, K});
  glogits.Upload(logits);
  cuda::MoeRoute(0, static_cast<float*>(gprobs.t.data), static_cast<int32_t*>(groutes.t.data),
                 static_cast<float*>(gweights.t.data), static_cast<const float*>(glogits.t.data),
                 T, E, K, renormalise);
  const std::vector<float> probs = gprobs.Download(), weights = gweights.Download();
  const std::vector<int32_t> routes = AsInts(groutes.Download());
  std::vector<float> want_probs(T * E), want_weights(T * K);
  for (int64_t t = 0; t < T; ++t) {
    double max = logits[t * E], sum = 0;
    for (int64_t e = 0; e < E; ++e) max = std::max<double>(max, logits[t * E + e]);
    for (int64_t e = 0; e < E; ++e) sum += std::exp(logits[t * E + e] - max);
    for (int64_t e = 0; e < E; ++e) {
      want_probs[t * E + e] = static_cast<float>(std::exp(logits[t * E + e] - max) / sum);
    }
    // The routes from the kernel's own probabilities: the top-k logic exactly.
    const std::vector<int32_t> want = TopK(probs.data() + t * E, E, K);
    for (int64_t k = 0; k < K; ++k) ASSERT_EQ(routes[t * K + k], want[k]) << "token " << t;
    double kept = 0;
    for (int64_t k = 0; k < K; ++k) kept += probs[t * E + want[k]];
    for (int64_t k = 0; k < K; ++k) {
      want_weights[t * K + k] =
          static_cast<float>(probs[t * E + want[k]] / (renormalise ? kept : 1.0));
    }
  }
  // The all-equal row: the K lowest ids.
  for (int64_t k = 0; k < K; ++k) EXPECT_EQ(routes[5 * K + k], k);
  EXPECT_LE(RelativeError(probs, want_probs), 1e-6);
  EXPECT_LE(RelativeError(weights, want_weights), 1e-6);
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaMoeRouteTest,
                         ::testing::Values(std::make_tuple(8, 2, true),
                                           std::make_tuple(8, 2, false),
                                           std::make_tuple(128, 8, true),
                                           std::make_tuple(256, 8, false)));

TEST(CudaMoeTest, GatherCopiesEachRowOfItsTokenExactly) {
  PRL_SKIP_WITHOUT_GPU();
  for (DType dt : {DType::kF32, DType::kBF16}) {
    const int64_t T = 9, C = 40, N = 14;
    const std::vector<float> in = AsStored(Random(T * C, 3), dt);
    std::vector<int32_t> token_of(N);
    for (int64_t r = 0; r < N; ++r) token_of[r] = static_cast<int32_t>((r * 5) % T);
    DeviceTensor gin(dt, {T, C}), gx(dt, {N, C}), gtok(DType::kI32, {N});
    gin.Upload(in);
    gtok.Upload(token_of);
    cuda::MoeGatherRows(0, dt, gx.t.data, gin.t.data, static_cast<const int32_t*>(gtok.t.data),
                        N, C);
    const std::vector<float> x = gx.Download();
    for (int64_t r = 0; r < N; ++r) {
      for (int64_t c = 0; c < C; ++c) ASSERT_EQ(x[r * C + c], in[token_of[r] * C + c]);
    }
  }
}

// out rows of expert e = a rows . w_e^T, on the host in float64.
std::vector<float> GroupedGemmReference(const std::vector<float>& a, const std::vector<float>& w,
                                        const std::vector<int32_t>& begin, int64_t Nout,
                                        int64_t Kdim) {
  const int64_t E = static_cast<int64_t>(begin.size()) - 1, N = begin.back();
  std::vector<float> out(N * Nout);
  for (int64_t e = 0; e < E; ++e) {
    for (int64_t r = begin[e]; r < begin[e + 1]; ++r) {
      for (int64_t c = 0; c < Nout; ++c) {
        double acc = 0;
        for (int64_t k = 0; k < Kdim; ++k) {
          acc += static_cast<double>(a[r * Kdim + k]) * w[(e * Nout + c) * Kdim + k];
        }
        out[r * Nout + c] = static_cast<float>(acc);
      }
    }
  }
  return out;
}

std::vector<float> RunGroupedGemm(DType dt, const std::vector<float>& a,
                                  const std::vector<float>& w, const std::vector<int32_t>& begin,
                                  int64_t Nout, int64_t Kdim) {
  const int64_t E = static_cast<int64_t>(begin.size()) - 1, N = begin.back();
  int64_t max_rows = 0;
  for (int64_t e = 0; e < E; ++e) max_rows = std::max<int64_t>(max_rows, begin[e + 1] - begin[e]);
  DeviceTensor ga(dt, {N, Kdim}), gw(dt, {E * Nout, Kdim}), gout(dt, {N, Nout});
  DeviceTensor gbegin(DType::kI32, {E + 1});
  ga.Upload(a);
  gw.Upload(w);
  gbegin.Upload(begin);
  cuda::MoeGroupedGemm(0, dt, gout.t.data, ga.t.data, gw.t.data,
                       static_cast<const int32_t*>(gbegin.t.data), E, max_rows, Nout, Kdim);
  return gout.Download();
}

TEST(CudaMoeTest, GroupedGemmMatchesPerExpertProductsOverUnevenAndEmptyExperts) {
  PRL_SKIP_WITHOUT_GPU();
  const int64_t Nout = 48, Kdim = 72;
  // 6 experts: 0, 1, 37, 0, 16 and 5 rows.
  const std::vector<int32_t> begin = {0, 0, 1, 38, 38, 54, 59};
  const int64_t E = 6, N = begin.back();
  for (DType dt : {DType::kF32, DType::kBF16}) {
    const std::vector<float> a = AsStored(Random(N * Kdim, 5), dt);
    const std::vector<float> w = AsStored(Random(E * Nout * Kdim, 6, 0.1f), dt);
    const std::vector<float> got = RunGroupedGemm(dt, a, w, begin, Nout, Kdim);
    EXPECT_LE(RelativeError(got, GroupedGemmReference(a, w, begin, Nout, Kdim)),
              testing::Tolerance(dt))
        << DTypeName(dt);
  }
}

TEST(CudaMoeTest, AGroupedGemmRowHasTheSameBitsWhateverOtherRowsItsExpertHas) {
  PRL_SKIP_WITHOUT_GPU();
  const int64_t Nout = 40, Kdim = 100, E = 2;
  const std::vector<float> w = Random(E * Nout * Kdim, 8, 0.1f);
  const std::vector<float> row = Random(Kdim, 9);
  // Alone in expert 1, then the 23rd of 40 rows of expert 1.
  std::vector<float> alone(row), crowded = Random(43 * Kdim, 10);
  std::copy(row.begin(), row.end(), crowded.begin() + (3 + 22) * Kdim);
  const std::vector<float> a = RunGroupedGemm(DType::kF32, alone, w, {0, 0, 1}, Nout, Kdim);
  const std::vector<float> b = RunGroupedGemm(DType::kF32, crowded, w, {0, 3, 43}, Nout, Kdim);
  const std::vector<float> b_row(b.begin() + (3 + 22) * Nout, b.begin() + (3 + 23) * Nout);
  EXPECT_TRUE(testing::BitEqual(a, b_row));
}

TEST(CudaMoeTest, CombineAddsTheWeightedExpertRowsToTheResidualInKOrder) {
  PRL_SKIP_WITHOUT_GPU();
  for (DType dt : {DType::kF32, DType::kBF16}) {
    const int64_t T = 11, K = 3, C = 24, N = T * K;
    const std::vector<float> residual = AsStored(Random(T * C, 12), dt);
    const std::vector<float> y = AsStored(Random(N * C, 13), dt);
    const std::vector<float> weights = Random(T * K, 14, 0.5f);
    std::vector<int32_t> row_of(N);
    for (int64_t i = 0; i < N; ++i) row_of[i] = static_cast<int32_t>((i * 7) % N);
    DeviceTensor gres(dt, {T, C}), gy(dt, {N, C}), gw(DType::kF32, {T, K});
    DeviceTensor grow(DType::kI32, {N}), gout(dt, {T, C});
    gres.Upload(residual);
    gy.Upload(y);
    gw.Upload(weights);
    grow.Upload(row_of);
    cuda::MoeCombine(0, dt, gout.t.data, gres.t.data, gy.t.data,
                     static_cast<const float*>(gw.t.data),
                     static_cast<const int32_t*>(grow.t.data), T, K, C);
    std::vector<float> want(T * C);
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t c = 0; c < C; ++c) {
        double acc = 0;
        for (int64_t k = 0; k < K; ++k) acc += weights[t * K + k] * y[row_of[t * K + k] * C + c];
        want[t * C + c] = static_cast<float>(residual[t * C + c] + acc);
      }
    }
    EXPECT_LE(RelativeError(gout.Download(), want), testing::Tolerance(dt)) << DTypeName(dt);
  }
}

TEST(CudaMoeTest, TheKernelsStayOffUntilAGpuSessionVerifiedThem) {
  EXPECT_FALSE(cuda::MoeCudaKernelsEnabled());
}
#else
TEST(CudaMoeTest, BuiltWithoutCuda) { GTEST_SKIP() << "built without CUDA"; }
#endif  // PRL_WITH_CUDA

}  // namespace
}  // namespace prl::kernels
