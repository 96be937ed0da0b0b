// Qwen3-MoE's CUDA kernels (kernels/cuda/moe.h) against host references of model/moe_layer.h's
// math: the router's softmax, its top-k with ties to the lower expert id, replayed rows and the
// renormalisation; the row gather (exact); the grouped GEMM over uneven expert row ranges
// (empty experts included), F32 and BF16, and bit for bit the same row whatever other rows its
// expert has (the batch-invariant order); the weighted combine; and, through kernels/moe.h on
// both backends, the sort by expert (equal to the CPU's), the combine's backward, the router's
// backward and the scatter of the experts' input gradients against the CPU backend. Skips
// without a GPU (scripts/gpu_check.sh runs it).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/moe.h"
#include "tests/kernels/cuda_test_util.h"
#include "tests/kernels/tensor_util.h"

#if PRL_WITH_CUDA
#include "kernels/cuda/moe.h"
#endif

namespace prl::kernels {
namespace {

using testing::AsStored;
using testing::Random;
using testing::RelativeError;
using testing::View;

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
  // Rows 7 and 20 replayed: the experts K-1, ..., 0 (row 7) and E-1, ..., E-K (row 20).
  std::vector<int32_t> forced(T * K, -1);
  for (int64_t k = 0; k < K; ++k) {
    forced[7 * K + k] = static_cast<int32_t>(K - 1 - k);
    forced[20 * K + k] = static_cast<int32_t>(E - 1 - k);
  }
  DeviceTensor glogits(DType::kF32, {T, E}), gprobs(DType::kF32, {T, E});
  DeviceTensor groutes(DType::kI32, {T, K}), grecomputed(DType::kI32, {T, K});
  DeviceTensor gweights(DType::kF32, {T, K}), gforced(DType::kI32, {T, K});
  glogits.Upload(logits);
  gforced.Upload(forced);
  cuda::MoeRoute(0, static_cast<float*>(gprobs.t.data), static_cast<int32_t*>(grecomputed.t.data),
                 static_cast<int32_t*>(groutes.t.data), static_cast<float*>(gweights.t.data),
                 static_cast<const float*>(glogits.t.data),
                 static_cast<const int32_t*>(gforced.t.data), T, E, K, renormalise);
  const std::vector<float> probs = gprobs.Download(), weights = gweights.Download();
  const std::vector<int32_t> routes = AsInts(groutes.Download());
  const std::vector<int32_t> recomputed = AsInts(grecomputed.Download());
  std::vector<float> want_probs(T * E), want_weights(T * K);
  for (int64_t t = 0; t < T; ++t) {
    double max = logits[t * E], sum = 0;
    for (int64_t e = 0; e < E; ++e) max = std::max<double>(max, logits[t * E + e]);
    for (int64_t e = 0; e < E; ++e) sum += std::exp(logits[t * E + e] - max);
    for (int64_t e = 0; e < E; ++e) {
      want_probs[t * E + e] = static_cast<float>(std::exp(logits[t * E + e] - max) / sum);
    }
    // The routes from the kernel's own probabilities: the top-k logic exactly; a replayed row's
    // routes are the given ones, its recomputed routes still the router's.
    const std::vector<int32_t> top = TopK(probs.data() + t * E, E, K);
    std::vector<int32_t> want = top;
    if (forced[t * K] >= 0) want.assign(forced.begin() + t * K, forced.begin() + (t + 1) * K);
    for (int64_t k = 0; k < K; ++k) {
      ASSERT_EQ(recomputed[t * K + k], top[k]) << "token " << t;
      ASSERT_EQ(routes[t * K + k], want[k]) << "token " << t;
    }
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

// Routes over E experts, T tokens, K each (distinct per token), from a seeded generator, with
// expert 3 (of E > 3) left empty and expert 0 crowded.
std::vector<int32_t> SomeRoutes(int64_t T, int64_t E, int64_t K, uint32_t seed) {
  std::vector<int32_t> routes(T * K);
  uint32_t state = seed;
  for (int64_t t = 0; t < T; ++t) {
    std::vector<int32_t> ids;
    for (int64_t e = 0; e < E; ++e) {
      if (e != 3) ids.push_back(static_cast<int32_t>(e));
    }
    for (int64_t k = 0; k < K; ++k) {
      state = state * 1664525u + 1013904223u;
      const size_t pick = k == 0 && t % 3 == 0 ? 0 : (state >> 8) % ids.size();
      routes[t * K + k] = ids[pick];
      ids.erase(ids.begin() + static_cast<int64_t>(pick));
    }
  }
  return routes;
}

// The sort on the device gives the CPU's rows exactly (a stable counting sort), for a pass of
// the learner's size (N = 8192 x 8 pairs over 128 experts) and a decode step's.
TEST(CudaMoeTest, TheSortByExpertOnTheDeviceEqualsTheCpusSort) {
  PRL_SKIP_WITHOUT_GPU();
  for (const auto [T, E, K] : {std::tuple<int64_t, int64_t, int64_t>{8192, 128, 8},
                               {3, 8, 2},
                               {1000, 256, 8}}) {
    SCOPED_TRACE(::testing::Message() << "T=" << T << " E=" << E << " K=" << K);
    std::vector<int32_t> routes = SomeRoutes(T, E, K, static_cast<uint32_t>(T + E));
    std::vector<int32_t> begin(E + 1), row_of(T * K), token_of(T * K);
    MoeSortByExpert(View(begin, {E + 1}), View(row_of, {T * K}), View(token_of, {T * K}),
                    View(routes, {T, K}), E);
    DeviceTensor groutes(DType::kI32, {T, K}), gbegin(DType::kI32, {E + 1});
    DeviceTensor grow(DType::kI32, {T * K}), gtok(DType::kI32, {T * K});
    groutes.Upload(routes);
    MoeSortByExpert(gbegin.t, grow.t, gtok.t, groutes.t, E);
    EXPECT_EQ(AsInts(gbegin.Download()), begin);
    EXPECT_EQ(AsInts(grow.Download()), row_of);
    EXPECT_EQ(AsInts(gtok.Download()), token_of);
  }
}

// The backward kernels through kernels/moe.h, CUDA against the CPU backend (F32 storage: the
// same arithmetic in another order, so within 1e-5; BF16: within BF16's tolerance).
TEST(CudaMoeTest, TheBackwardKernelsMatchTheCpuBackend) {
  PRL_SKIP_WITHOUT_GPU();
  const int64_t T = 29, E = 16, K = 4, C = 72, N = T * K;
  std::vector<int32_t> routes = SomeRoutes(T, E, K, 5);
  std::vector<int32_t> begin(E + 1), row_of(N), token_of(N);
  MoeSortByExpert(View(begin, {E + 1}), View(row_of, {N}), View(token_of, {N}),
                  View(routes, {T, K}), E);
  std::vector<float> probs(T * E), weights(T * K);
  {
    std::vector<float> logits = Random(T * E, 21, 2.0f);
    std::vector<int32_t> recomputed(T * K), forced(routes), used(T * K);
    MoeRoute(View(probs, {T, E}), View(recomputed, {T, K}), View(used, {T, K}),
             View(weights, {T, K}), View(logits, {T, E}), View(forced, {T, K}), true);
  }
  std::vector<float> aux = Random(E, 22, 0.01f);
  for (DType dt : {DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(DTypeName(dt));
    std::vector<float> dout = AsStored(Random(T * C, 23), dt), y = AsStored(Random(N * C, 24), dt);
    std::vector<float> dxs = AsStored(Random(N * C, 25), dt), dx = AsStored(Random(T * C, 26), dt);
    // CPU.
    std::vector<float> dy(N * C), dweights(T * K), dlogits(T * E), dlogits_aux(T * E), dx_cpu(dx);
    MoeCombineBackward(View(dy, {N, C}), View(dweights, {T, K}), View(dout, {T, C}),
                       View(y, {N, C}), View(weights, {T, K}), View(row_of, {N}));
    for (bool renormalise : {true, false}) {
      MoeRouterBackward(View(renormalise ? dlogits : dlogits_aux, {T, E}), View(probs, {T, E}),
                        View(routes, {T, K}), View(weights, {T, K}), View(dweights, {T, K}),
                        renormalise ? Tensor() : View(aux, {E}), renormalise);
    }
    MoeScatterAddRows(View(dx_cpu, {T, C}), View(dxs, {N, C}), View(row_of, {N}));
    // CUDA.
    DeviceTensor gdy(dt, {N, C}), gdw(DType::kF32, {T, K}), gdout(dt, {T, C}), gy(dt, {N, C});
    DeviceTensor gw(DType::kF32, {T, K}), grow(DType::kI32, {N}), gprobs(DType::kF32, {T, E});
    DeviceTensor groutes(DType::kI32, {T, K}), gdl(DType::kF32, {T, E}), gdl_aux(DType::kF32, {T, E});
    DeviceTensor gaux(DType::kF32, {E}), gdxs(dt, {N, C}), gdx(dt, {T, C});
    gdout.Upload(dout);
    gy.Upload(y);
    gw.Upload(weights);
    grow.Upload(row_of);
    gprobs.Upload(probs);
    groutes.Upload(routes);
    gaux.Upload(aux);
    gdxs.Upload(dxs);
    gdx.Upload(dx);
    MoeCombineBackward(gdy.t, gdw.t, gdout.t, gy.t, gw.t, grow.t);
    // The router's backward from the CPU's dweights, so that each kernel is checked alone.
    DeviceTensor gdw_cpu(DType::kF32, {T, K});
    gdw_cpu.Upload(dweights);
    MoeRouterBackward(gdl.t, gprobs.t, groutes.t, gw.t, gdw_cpu.t, Tensor(), true);
    MoeRouterBackward(gdl_aux.t, gprobs.t, groutes.t, gw.t, gdw_cpu.t, gaux.t, false);
    MoeScatterAddRows(gdx.t, gdxs.t, grow.t);
    const double tol = dt == DType::kF32 ? 1e-5 : testing::Tolerance(dt);
    EXPECT_LE(RelativeError(gdy.Download(), dy), tol) << "dy";
    EXPECT_LE(RelativeError(gdw.Download(), dweights), 1e-5) << "dweights";
    EXPECT_LE(RelativeError(gdl.Download(), dlogits), 1e-5) << "dlogits";
    EXPECT_LE(RelativeError(gdl_aux.Download(), dlogits_aux), 1e-5) << "dlogits with aux";
    EXPECT_LE(RelativeError(gdx.Download(), dx_cpu), tol) << "dx";
  }
}
#else
TEST(CudaMoeTest, BuiltWithoutCuda) { GTEST_SKIP() << "built without CUDA"; }
#endif  // PRL_WITH_CUDA

}  // namespace
}  // namespace prl::kernels
