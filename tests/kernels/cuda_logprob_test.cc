// The fused LM-head log-prob on CUDA against the CPU backend: several chunks of rows (the last
// one partial), temperature 0.7, a vocabulary that is not a multiple of 8 (odd row strides of
// the logits chunk and of the BF16 dlogits: cuBLASLt takes a slower non-tensor-core kernel for
// those GEMMs, which must still be right), hidden sizes a multiple of 8 as the model's are,
// dW accumulated into an F32 or a BF16 tensor. Outputs are NaN-poisoned first (dW is an
// accumulator: it starts from known values). Skips without a GPU.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/dtype.h"
#include "kernels/logprob.h"
#include "tests/kernels/cuda_test_util.h"
#include "tests/kernels/tensor_util.h"

namespace prl::kernels {
namespace {

using testing::AsStored;
using testing::Random;
using testing::RelativeError;
using testing::View;

struct LogprobCase {
  int64_t R, V, C, chunk_rows;
  DType dW_dtype;
};

class CudaLogprobTest : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override { PRL_SKIP_WITHOUT_GPU(); }
  DType dt() const { return GetParam(); }
  void ExpectClose(const std::string& what, const std::vector<float>& got,
                   const std::vector<float>& want, double tolerance) {
    const double err = RelativeError(got, want);
    EXPECT_LE(err, tolerance) << what << " (" << DTypeName(dt()) << "): relative error " << err;
    RecordProperty(what + "_" + std::string(DTypeName(dt())), std::to_string(err));
  }
};

TEST_P(CudaLogprobTest, ForwardAndBackwardMatchCpuAcrossChunks) {
#if PRL_WITH_CUDA
  using testing::DeviceTensor;
  const float temperature = 0.7f;
  std::vector<LogprobCase> cases = {
      {45, 1001, 64, 16, DType::kF32},  // 3 chunks (16, 16, 13), odd V
      {45, 1001, 96, 45, DType::kF32},  // one chunk holding every row
      {7, 517, 64, 3, DType::kF32},     // 3 chunks (3, 3, 1)
  };
  if (dt() == DType::kBF16) cases.push_back({45, 1001, 64, 16, DType::kBF16});
  uint32_t seed = 200;
  for (const LogprobCase& c : cases) {
    const std::string name = absl::StrCat("R", c.R, "_V", c.V, "_C", c.C, "_chunk", c.chunk_rows,
                                          "_dW", DTypeName(c.dW_dtype));
    SCOPED_TRACE(name);
    const int64_t R = c.R, V = c.V, C = c.C;
    auto h = AsStored(Random(R * C, seed += 4), dt());
    auto W = AsStored(Random(V * C, seed + 1, 0.3f), dt());
    auto dlogprob = Random(R, seed + 2);
    auto dW0 = AsStored(Random(V * C, seed + 3), c.dW_dtype);
    std::vector<int32_t> targets(R);
    for (int64_t r = 0; r < R; ++r) targets[r] = static_cast<int32_t>((r * 131 + 7) % V);
    targets[0] = static_cast<int32_t>(V - 1);  // the last column of an odd-width row

    std::vector<float> logprob(R), lse(R), entropy(R), scratch(c.chunk_rows * V), dh(R * C),
        dW = dW0;
    const Tensor entropy_view = View(entropy, {R});
    LogprobForward(View(logprob, {R}), View(lse, {R}), View(h, {R, C}), View(W, {V, C}),
                   View(targets, {R}), temperature, View(scratch, {c.chunk_rows, V}),
                   ReductionOrder::kFast, &entropy_view);
    LogprobBackward(View(dh, {R, C}), View(dW, {V, C}), View(dlogprob, {R}), View(h, {R, C}),
                    View(W, {V, C}), View(targets, {R}), View(lse, {R}), temperature,
                    View(scratch, {c.chunk_rows, V}));

    DeviceTensor gh(dt(), {R, C}), gW(dt(), {V, C}), gt(DType::kI32, {R}), glp(DType::kF32, {R}),
        glse(DType::kF32, {R}), gscratch(DType::kF32, {c.chunk_rows, V}), gdlp(DType::kF32, {R}),
        gdh(dt(), {R, C}), gdW(c.dW_dtype, {V, C}), gentropy(DType::kF32, {R});
    gh.Upload(h);
    gW.Upload(W);
    gt.Upload(targets);
    gdlp.Upload(dlogprob);
    gdW.Upload(dW0);
    LogprobForward(glp.t, glse.t, gh.t, gW.t, gt.t, temperature, gscratch.t, ReductionOrder::kFast,
                   &gentropy.t);
    const double tol = testing::Tolerance(dt());
    ExpectClose(name + "_logprob", glp.Download(), logprob, tol);
    ExpectClose(name + "_lse", glse.Download(), lse, tol);
    ExpectClose(name + "_entropy", gentropy.Download(), entropy, tol);
    LogprobBackward(gdh.t, gdW.t, gdlp.t, gh.t, gW.t, gt.t, glse.t, temperature, gscratch.t);
    ExpectClose(name + "_dh", gdh.Download(), dh, tol);
    // A BF16 dW rounds the accumulated sum once more: compare it with the sum as stored.
    ExpectClose(name + "_dW", gdW.Download(), AsStored(dW, c.dW_dtype), tol);
  }
#endif
}

INSTANTIATE_TEST_SUITE_P(Modes, CudaLogprobTest, ::testing::Values(DType::kF32, DType::kBF16),
                         [](const ::testing::TestParamInfo<DType>& info) {
                           return std::string(DTypeName(info.param));
                         });

}  // namespace
}  // namespace prl::kernels
