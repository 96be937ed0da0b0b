// kernels/cuda/gemm.h directly: every transpose combination, awkward shapes (M, N, K not
// multiples of 8; odd row strides in fp32), alpha/beta, the bias epilogue (including BF16
// inputs into an F32 output), against a float64 reference on the same (bf16-rounded) inputs;
// and the GEMM running on whatever stream the caller passes (a side stream under StreamGuard).
// Skips without a GPU.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/device.h"
#include "core/dtype.h"
#include "kernels/matmul.h"
#include "tests/kernels/cuda_test_util.h"
#include "tests/kernels/tensor_util.h"

#if PRL_WITH_CUDA
#include "core/cuda/stream.h"
#include "kernels/cuda/gemm.h"

namespace prl::kernels {
namespace {

using testing::AsStored;
using testing::DeviceTensor;
using testing::Random;
using testing::RelativeError;
using testing::Tolerance;

struct GemmCase {
  bool trans_a, trans_b;
  int64_t M, N, K;
  int64_t pad_a, pad_b, pad_d;  // extra elements per stored row (row stride - row length)
  float alpha, beta;
  bool bias;
  bool f32_output;  // with BF16 inputs: write an F32 D (the weight-gradient case)
};

std::string Describe(const GemmCase& c, DType ab) {
  return absl::StrCat(DTypeName(ab), c.f32_output ? "->F32" : "", " ta=", c.trans_a,
                      " tb=", c.trans_b, " M=", c.M, " N=", c.N, " K=", c.K, " pads ", c.pad_a, "/",
                      c.pad_b, "/", c.pad_d, " alpha=", c.alpha, " beta=", c.beta,
                      c.bias ? " +bias" : "");
}

// D = alpha op(A) op(B) + beta D0 (+ bias), in float64, row-major with the given strides.
std::vector<float> Reference(const GemmCase& c, const std::vector<float>& a, int64_t lda,
                             const std::vector<float>& b, int64_t ldb, const std::vector<float>& d0,
                             int64_t ldd, const std::vector<float>& bias) {
  std::vector<float> d = d0;
  for (int64_t m = 0; m < c.M; ++m) {
    for (int64_t n = 0; n < c.N; ++n) {
      double s = 0;
      for (int64_t k = 0; k < c.K; ++k) {
        const double x = c.trans_a ? a[k * lda + m] : a[m * lda + k];
        const double y = c.trans_b ? b[n * ldb + k] : b[k * ldb + n];
        s += x * y;
      }
      double v = c.alpha * s + c.beta * static_cast<double>(d0[m * ldd + n]);
      if (c.bias) v += bias[n];
      d[m * ldd + n] = static_cast<float>(v);
    }
  }
  return d;
}

class CudaGemmTest : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override { PRL_SKIP_WITHOUT_GPU(); }
};

TEST_P(CudaGemmTest, EveryTransposeAndAwkwardShapeMatchesAFloat64Reference) {
  const DType ab = GetParam();
  // BF16 rows are padded to multiples of 8 elements (16 bytes): the alignment cuBLASLt's BF16
  // kernels need; fp32 also runs with odd strides (4-byte alignment).
  const bool f32 = ab == DType::kF32;
  std::vector<GemmCase> cases = {
      {false, true, 37, 45, 33, f32 ? 0 : 7, f32 ? 0 : 3, f32 ? 0 : 3, 1, 0, false, false},
      {false, false, 1, 7, 5, f32 ? 2 : 3, f32 ? 0 : 1, f32 ? 1 : 1, 1, 0, true, false},
      {true, false, 29, 40, 56, f32 ? 1 : 3, 0, 0, 1, 1, false, false},
      {true, true, 16, 24, 9, f32 ? 3 : 0, f32 ? 0 : 7, f32 ? 5 : 0, 0.5f, 1, true, false},
      {false, true, 130, 19, 70, f32 ? 0 : 2, f32 ? 0 : 2, f32 ? 0 : 5, -1.5f, 0.25f, true, false},
      {false, true, 1, 1, 1, f32 ? 0 : 7, f32 ? 0 : 7, f32 ? 0 : 7, 1, 0, true, false},
  };
  if (!f32) {  // BF16 inputs, F32 output (with and without bias, accumulating)
    cases.push_back({true, false, 48, 40, 37, 0, 0, 0, 1, 1, false, true});
    cases.push_back({false, true, 21, 64, 32, 0, 0, 0, 1, 0, true, true});
  }
  for (const GemmCase& c : cases) {
    SCOPED_TRACE(Describe(c, ab));
    const DType dd = c.f32_output ? DType::kF32 : ab;
    const int64_t a_rows = c.trans_a ? c.K : c.M, a_cols = c.trans_a ? c.M : c.K;
    const int64_t b_rows = c.trans_b ? c.N : c.K, b_cols = c.trans_b ? c.K : c.N;
    const int64_t lda = a_cols + c.pad_a, ldb = b_cols + c.pad_b, ldd = c.N + c.pad_d;
    const auto a = AsStored(Random(a_rows * lda, 101), ab);
    const auto b = AsStored(Random(b_rows * ldb, 102), ab);
    const auto d0 = AsStored(Random(c.M * ldd, 103), dd);
    const auto bias = AsStored(Random(c.N, 104), dd);
    std::vector<float> want = Reference(c, a, lda, b, ldb, d0, ldd, bias);

    DeviceTensor ga(ab, {a_rows, lda}), gb(ab, {b_rows, ldb}), gd(dd, {c.M, ldd}), gbias(dd, {c.N});
    ga.Upload(a);
    gb.Upload(b);
    gd.Upload(d0);
    gbias.Upload(bias);
    cuda::GemmArgs g;
    g.trans_a = c.trans_a;
    g.trans_b = c.trans_b;
    g.M = c.M;
    g.N = c.N;
    g.K = c.K;
    g.a = ga.t.data;
    g.lda = lda;
    g.b = gb.t.data;
    g.ldb = ldb;
    g.d = gd.t.data;
    g.ldd = ldd;
    g.ab_dtype = ab;
    g.d_dtype = dd;
    g.alpha = c.alpha;
    g.beta = c.beta;
    g.bias = c.bias ? gbias.t.data : nullptr;
    cuda::Gemm(0, prl::cuda::CurrentStream(0), g);
    const std::vector<float> got = gd.Download();
    EXPECT_LE(RelativeError(got, want), Tolerance(dd));
    // The padding between rows is untouched.
    for (int64_t m = 0; m < c.M; ++m) {
      for (int64_t n = c.N; n < ldd; ++n) ASSERT_EQ(got[m * ldd + n], d0[m * ldd + n]);
    }
  }
}

// Kernels go to the stream StreamGuard makes current: with the side stream held back by a
// host function, the dispatcher's GEMM must not have run; once released, its result is right.
TEST_P(CudaGemmTest, DispatcherRunsOnTheStreamThatStreamGuardMakesCurrent) {
  const DType dt = GetParam();
  const int64_t M = 24, N = 40, K = 32;
  const auto a = AsStored(Random(M * K, 105), dt), w = AsStored(Random(N * K, 106), dt);
  std::vector<float> want(M * N);
  std::vector<float> a32 = a, w32 = w;
  MatmulForward(testing::View(want, {M, N}), testing::View(a32, {M, K}),
                testing::View(w32, {N, K}));
  DeviceTensor ga(dt, {M, K}), gw(dt, {N, K}), gout(dt, {M, N});
  ga.Upload(a);
  gw.Upload(w);
  absl::StatusOr<prl::cuda::Stream> side = prl::cuda::Stream::Create(0);
  ASSERT_TRUE(side.ok()) << side.status();
  {
    prl::cuda::StreamGuard guard(0, side->get());
    ASSERT_EQ(prl::cuda::CurrentStream(0), side->get());
    MatmulForward(gout.t, ga.t, gw.t);  // warm-up: plan and workspace for this stream exist
  }
  ASSERT_TRUE(side->Synchronize().ok());
  testing::Poison(gout.t);
  DeviceTensor::Synchronize();

  // Hold the side stream until released (bounded, so a mistake fails instead of hanging).
  static std::atomic<bool> release;
  release = false;
  auto hold = [](void*) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!release.load() && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::yield();
    }
  };
  PRL_CUDA_CHECK(cudaLaunchHostFunc(side->get(), hold, nullptr));
  {
    prl::cuda::StreamGuard guard(0, side->get());
    MatmulForward(gout.t, ga.t, gw.t);
  }
  EXPECT_EQ(prl::cuda::CurrentStream(0), cudaStreamPerThread) << "the guard restores";
  // The legacy stream is not ordered with a non-blocking stream: this copy sees the poison.
  std::vector<float> early(static_cast<size_t>(M * N));
  std::vector<uint16_t> early16(early.size());
  void* host = dt == DType::kF32 ? static_cast<void*>(early.data()) : early16.data();
  PRL_CUDA_CHECK(cudaMemcpy(host, gout.t.data, gout.t.bytes(), cudaMemcpyDeviceToHost));
  if (dt == DType::kBF16) {
    for (size_t i = 0; i < early.size(); ++i) early[i] = Bf16ToF32(early16[i]);
  }
  release = true;
  ASSERT_TRUE(side->Synchronize().ok());
  EXPECT_TRUE(std::isnan(early[0]) && std::isnan(early.back()))
      << "the GEMM ran before its stream was released: it was not on the guarded stream";
  EXPECT_LE(RelativeError(gout.Download(), want), Tolerance(dt));
}

INSTANTIATE_TEST_SUITE_P(Modes, CudaGemmTest, ::testing::Values(DType::kF32, DType::kBF16),
                         [](const auto& info) { return std::string(DTypeName(info.param)); });

}  // namespace
}  // namespace prl::kernels
#endif  // PRL_WITH_CUDA
