// Causal GQA attention on CUDA against the CPU backend, over packed sequences whose lengths
// cross the 64-row tiles (1, 17, 64, 129, 300, ...), for MHA, GQA and MQA head layouts and
// head_dim 16 (generic kernel), 64 and 128 (FlashAttention kernels in BF16 mode). Outputs are
// NaN-poisoned first, so an element the kernels never write fails. Also pins down the fused
// kernels' promises: deterministic backward, rows independent of the other sequences packed
// beside them. Skips without a GPU.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/dtype.h"
#include "kernels/attention.h"
#include "tests/kernels/cuda_test_util.h"
#include "tests/kernels/tensor_util.h"

#if PRL_WITH_CUDA
#include "kernels/cuda/attention_kernels.h"
#endif

namespace prl::kernels {
namespace {

using testing::AsStored;
using testing::Random;
using testing::RelativeError;
using testing::View;

#if PRL_WITH_CUDA
using testing::DeviceTensor;

struct AttentionCase {
  std::vector<int32_t> lengths;
  int64_t H, KV, D;
};

std::string Name(const AttentionCase& c) {
  return absl::StrCat("H", c.H, "_KV", c.KV, "_D", c.D, "_len_", absl::StrJoin(c.lengths, "_"));
}

std::vector<int32_t> Offsets(const std::vector<int32_t>& lengths) {
  std::vector<int32_t> cu = {0};
  for (int32_t l : lengths) cu.push_back(cu.back() + l);
  return cu;
}

// A packed batch's inputs on the GPU and its CPU reference outputs.
struct Problem {
  AttentionCase c;
  DType dt;
  int64_t T, B, width, HD;
  std::vector<int32_t> cu;
  std::vector<float> qkv, dout, out, out_stored, lse, dqkv;

  Problem(AttentionCase c_in, DType dt_in, uint32_t seed) : c(std::move(c_in)), dt(dt_in) {
    cu = Offsets(c.lengths);
    T = cu.back();
    B = static_cast<int64_t>(c.lengths.size());
    width = (c.H + 2 * c.KV) * c.D;
    HD = c.H * c.D;
    qkv = AsStored(Random(T * width, seed), dt);
    dout = AsStored(Random(T * HD, seed + 1), dt);
  }
  AttentionShape shape() const { return {c.H, c.KV, c.D}; }

  void RunCpu() {
    out.assign(T * HD, 0.0f);
    lse.assign(T * c.H, 0.0f);
    dqkv.assign(T * width, 0.0f);
    AttentionForward(View(out, {T, HD}), View(lse, {T, c.H}), View(qkv, {T, width}),
                     View(cu, {B + 1}), shape());
    // The backward consumes the forward's output as the GPU stores it (bf16-rounded).
    out_stored = AsStored(out, dt);
    AttentionBackward(View(dqkv, {T, width}), View(dout, {T, HD}), View(qkv, {T, width}),
                      View(out_stored, {T, HD}), View(lse, {T, c.H}), View(cu, {B + 1}), shape());
  }
};

// Device tensors of one problem; outputs NaN-poisoned at construction.
struct DeviceProblem {
  DeviceTensor qkv, cu, dout, out, lse, dqkv;
  explicit DeviceProblem(const Problem& p)
      : qkv(p.dt, {p.T, p.width}),
        cu(DType::kI32, {p.B + 1}),
        dout(p.dt, {p.T, p.HD}),
        out(p.dt, {p.T, p.HD}),
        lse(DType::kF32, {p.T, p.c.H}),
        dqkv(p.dt, {p.T, p.width}) {
    qkv.Upload(p.qkv);
    cu.Upload(p.cu);
    dout.Upload(p.dout);
  }
  void Forward(const Problem& p) { AttentionForward(out.t, lse.t, qkv.t, cu.t, p.shape()); }
  void Backward(const Problem& p) {
    AttentionBackward(dqkv.t, dout.t, qkv.t, out.t, lse.t, cu.t, p.shape());
  }
};

std::vector<uint16_t> Bits(const std::vector<float>& v) {
  std::vector<uint16_t> bits(v.size());
  for (size_t i = 0; i < v.size(); ++i) bits[i] = F32ToBf16(v[i]);  // exact for bf16 values
  return bits;
}
#endif

class CudaAttentionTest : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override { PRL_SKIP_WITHOUT_GPU(); }
  DType dt() const { return GetParam(); }
  void ExpectClose(const std::string& what, const std::vector<float>& got,
                   const std::vector<float>& want) {
    const double err = RelativeError(got, want);
    EXPECT_LE(err, testing::Tolerance(dt()))
        << what << " (" << DTypeName(dt()) << "): relative error " << err;
    RecordProperty(what + "_" + std::string(DTypeName(dt())), std::to_string(err));
  }
};

TEST_P(CudaAttentionTest, ForwardAndBackwardMatchCpuAcrossTileBoundaries) {
#if PRL_WITH_CUDA
  const std::vector<int32_t> mixed = {1, 17, 64, 129, 300};
  const std::vector<AttentionCase> cases = {
      {mixed, 8, 2, 64},
      {mixed, 8, 8, 64},
      {mixed, 4, 1, 128},
      {mixed, 8, 2, 16},
      {{300, 1, 65, 2}, 4, 4, 128},
      {{5, 40, 3}, 4, 1, 16},
      {{700, 63}, 8, 2, 128},
  };
  uint32_t seed = 100;
  for (const AttentionCase& c : cases) {
    SCOPED_TRACE(Name(c));
    Problem p(c, dt(), seed += 2);
    p.RunCpu();
    DeviceProblem g(p);
    g.Forward(p);
    ExpectClose(Name(c) + "_out", g.out.Download(), p.out);
    ExpectClose(Name(c) + "_lse", g.lse.Download(), p.lse);
    g.out.Upload(p.out_stored);
    g.Backward(p);
    ExpectClose(Name(c) + "_dqkv", g.dqkv.Download(), p.dqkv);
  }
#endif
}

#if PRL_WITH_CUDA
TEST(CudaFlashAttentionTest, TakesTheFusedPathForBf16HeadDim64And128Only) {
  alignas(16) static const char buffer[32] = {};
  EXPECT_TRUE(cuda::FlashAttentionSupported(DType::kBF16, 64, {buffer}));
  EXPECT_TRUE(cuda::FlashAttentionSupported(DType::kBF16, 128, {buffer}));
  EXPECT_FALSE(cuda::FlashAttentionSupported(DType::kBF16, 16, {buffer}));
  EXPECT_FALSE(cuda::FlashAttentionSupported(DType::kF32, 64, {buffer}));
  EXPECT_FALSE(cuda::FlashAttentionSupported(DType::kBF16, 64, {buffer + 2}));
}

TEST(CudaFlashAttentionTest, BackwardIsDeterministic) {
  PRL_SKIP_WITHOUT_GPU();
  Problem p({{1, 17, 64, 129, 300}, 8, 2, 64}, DType::kBF16, 7);
  DeviceProblem g(p);
  g.Forward(p);
  g.Backward(p);
  const std::vector<float> first = g.dqkv.Download();
  testing::Poison(g.dqkv.t);
  g.Backward(p);
  EXPECT_TRUE(Bits(first) == Bits(g.dqkv.Download()));
}

// A sequence's rows come out bit-identical whether it is packed alone or after others.
TEST(CudaFlashAttentionTest, RowsDoNotDependOnTheOtherSequences) {
  PRL_SKIP_WITHOUT_GPU();
  for (int64_t D : {64, 128}) {
    Problem packed({{37, 129, 200}, 4, 2, D}, DType::kBF16, 11);
    Problem alone({{200}, 4, 2, D}, DType::kBF16, 11);
    const int64_t first = 37 + 129;
    alone.qkv.assign(packed.qkv.begin() + first * packed.width, packed.qkv.end());
    alone.dout.assign(packed.dout.begin() + first * packed.HD, packed.dout.end());
    DeviceProblem gp(packed), ga(alone);
    gp.Forward(packed);
    gp.Backward(packed);
    ga.Forward(alone);
    ga.Backward(alone);
    const std::vector<float> out_p = gp.out.Download(), dqkv_p = gp.dqkv.Download();
    const std::vector<float> out_tail(out_p.begin() + first * packed.HD, out_p.end());
    const std::vector<float> dqkv_tail(dqkv_p.begin() + first * packed.width, dqkv_p.end());
    EXPECT_TRUE(Bits(out_tail) == Bits(ga.out.Download())) << "D=" << D;
    EXPECT_TRUE(Bits(dqkv_tail) == Bits(ga.dqkv.Download())) << "D=" << D;
  }
}
#endif

INSTANTIATE_TEST_SUITE_P(Modes, CudaAttentionTest, ::testing::Values(DType::kF32, DType::kBF16),
                         [](const ::testing::TestParamInfo<DType>& info) {
                           return std::string(DTypeName(info.param));
                         });

}  // namespace
}  // namespace prl::kernels
