// The CUDA backend against the CPU backend (the reference), kernel by kernel, on fresh random
// inputs: fp32 mode within 1e-5 relative (||got - want|| / ||want||), bf16 mode within 1e-2,
// with the CPU fed the same bf16-rounded inputs so that the bound measures the kernel, not the
// input rounding. Every output is poisoned with NaN first, so an unwritten element fails.
// Without a GPU the tests skip (CI compiles them; scripts/gpu_check.sh runs them).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/buffer.h"
#include "core/device.h"
#include "core/dtype.h"
#include "kernels/attention.h"
#include "kernels/convert.h"
#include "kernels/embedding.h"
#include "kernels/logprob.h"
#include "kernels/matmul.h"
#include "kernels/optimizer.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope.h"
#include "kernels/swiglu.h"
#include "tests/kernels/cuda_test_util.h"
#include "tests/kernels/tensor_util.h"

namespace prl::kernels {
namespace {

using testing::AsStored;
using testing::Random;
using testing::RelativeError;
using testing::Tolerance;
using testing::View;

#if PRL_WITH_CUDA
using testing::DeviceTensor;

std::string Sci(double x) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.3e", x);
  return buf;
}

class CudaKernelTest : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override { PRL_SKIP_WITHOUT_GPU(); }
  DType dt() const { return GetParam(); }
  void ExpectClose(const char* what, const std::vector<float>& got,
                   const std::vector<float>& want) {
    const double err = RelativeError(got, want);
    EXPECT_LE(err, Tolerance(dt()))
        << what << " (" << DTypeName(dt()) << "): relative error " << err;
    RecordProperty(std::string(what) + "_" + std::string(DTypeName(dt())), Sci(err));
  }
};

TEST_P(CudaKernelTest, MatmulForwardWithBiasAndAccumulateMatchesCpu) {
  const int64_t M = 37, N = 48, K = dt() == DType::kF32 ? 70 : 64;
  auto a = AsStored(Random(M * K, 1), dt()), w = AsStored(Random(N * K, 2), dt()),
       bias = AsStored(Random(N, 3), dt()), acc = AsStored(Random(M * N, 4), dt());
  for (bool accumulate : {false, true}) {
    std::vector<float> want = acc;
    MatmulForward(View(want, {M, N}), View(a, {M, K}), View(w, {N, K}), View(bias, {N}),
                  accumulate);
    DeviceTensor da(dt(), {M, K}), dw(dt(), {N, K}), db(dt(), {N}), dout(dt(), {M, N});
    da.Upload(a);
    dw.Upload(w);
    db.Upload(bias);
    if (accumulate) dout.Upload(acc);
    MatmulForward(dout.t, da.t, dw.t, db.t, accumulate);
    ExpectClose(accumulate ? "matmul_accumulate" : "matmul", dout.Download(), want);
  }
}

TEST_P(CudaKernelTest, MatmulBackwardMatchesCpu) {
  const int64_t M = 29, N = 40, K = 56;
  auto a = AsStored(Random(M * K, 5), dt()), w = AsStored(Random(N * K, 6), dt()),
       dout = AsStored(Random(M * N, 7), dt());
  auto dw0 = Random(N * K, 8), db0 = Random(N, 9);
  std::vector<float> da_want(M * K), dw_want = dw0, db_want = db0;
  MatmulBackward(View(da_want, {M, K}), View(dw_want, {N, K}), View(db_want, {N}),
                 View(dout, {M, N}), View(a, {M, K}), View(w, {N, K}));
  DeviceTensor ga(dt(), {M, K}), gw(dt(), {N, K}), gdout(dt(), {M, N}), gda(dt(), {M, K}),
      gdw(DType::kF32, {N, K}), gdb(DType::kF32, {N});
  ga.Upload(a);
  gw.Upload(w);
  gdout.Upload(dout);
  gdw.Upload(dw0);
  gdb.Upload(db0);
  MatmulBackward(gda.t, gdw.t, gdb.t, gdout.t, ga.t, gw.t);
  ExpectClose("matmul_da", gda.Download(), da_want);
  ExpectClose("matmul_dw", gdw.Download(), dw_want);
  ExpectClose("matmul_dbias", gdb.Download(), db_want);
}

TEST_P(CudaKernelTest, RmsNormForwardAndBackwardMatchCpu) {
  const int64_t T = 19, C = 96;
  auto x = AsStored(Random(T * C, 10), dt()), w = AsStored(Random(C, 11, 0.5f), dt()),
       dy = AsStored(Random(T * C, 12), dt()), dx0 = AsStored(Random(T * C, 13), dt());
  auto dw0 = Random(C, 14);
  std::vector<float> y(T * C), rstd(T), dx = dx0, dw = dw0;
  RmsNormForward(View(y, {T, C}), View(rstd, {T}), View(x, {T, C}), View(w, {C}), 1e-6f);
  RmsNormBackward(View(dx, {T, C}), View(dw, {C}), View(dy, {T, C}), View(x, {T, C}), View(w, {C}),
                  View(rstd, {T}));
  DeviceTensor gx(dt(), {T, C}), gw(dt(), {C}), gy(dt(), {T, C}), grstd(DType::kF32, {T}),
      gdy(dt(), {T, C}), gdx(dt(), {T, C}), gdw(DType::kF32, {C});
  gx.Upload(x);
  gw.Upload(w);
  gdy.Upload(dy);
  gdx.Upload(dx0);
  gdw.Upload(dw0);
  RmsNormForward(gy.t, grstd.t, gx.t, gw.t, 1e-6f);
  RmsNormBackward(gdx.t, gdw.t, gdy.t, gx.t, gw.t, grstd.t);
  ExpectClose("rmsnorm_y", gy.Download(), y);
  ExpectClose("rmsnorm_rstd", grstd.Download(), rstd);
  ExpectClose("rmsnorm_dx", gdx.Download(), dx);
  ExpectClose("rmsnorm_dw", gdw.Download(), dw);
}

// Qwen3's q/k heads out of and back into the packed qkv rows: exact, in either dtype.
TEST_P(CudaKernelTest, CopyColumnsMatchesCpu) {
  const int64_t T = 13, Ws = 96, Wd = 40, width = 32, src_col = 48, dst_col = 8;
  auto src = AsStored(Random(T * Ws, 16), dt()), dst0 = AsStored(Random(T * Wd, 17), dt());
  std::vector<float> want = dst0;
  CopyColumns(View(want, {T, Wd}), dst_col, View(src, {T, Ws}), src_col, width);
  DeviceTensor gsrc(dt(), {T, Ws}), gdst(dt(), {T, Wd});
  gsrc.Upload(src);
  gdst.Upload(dst0);
  CopyColumns(gdst.t, dst_col, gsrc.t, src_col, width);
  EXPECT_EQ(gdst.Download(), want);
}

TEST_P(CudaKernelTest, RopeTablesApplyAndInverseMatchCpu) {
  const int64_t T = 23, D = 16, heads = 6, W = 128, half = D / 2;
  std::vector<int32_t> positions(T);
  for (int64_t t = 0; t < T; ++t) positions[t] = static_cast<int32_t>(t * 37 % 2049);
  std::vector<float> inv_freq(half);
  for (int64_t i = 0; i < half; ++i) inv_freq[i] = std::pow(10000.0f, -2.0f * i / D);
  auto x = AsStored(Random(T * W, 15), dt());
  std::vector<float> cos(T * half), sin(T * half), rotated = x;
  RopeTables(View(cos, {T, half}), View(sin, {T, half}), View(positions, {T}),
             View(inv_freq, {half}));
  RopeApply(View(rotated, {T, W}), heads, D, View(cos, {T, half}), View(sin, {T, half}), false);
  DeviceTensor gpos(DType::kI32, {T}), gfreq(DType::kF32, {half}), gcos(DType::kF32, {T, half}),
      gsin(DType::kF32, {T, half}), gx(dt(), {T, W});
  gpos.Upload(positions);
  gfreq.Upload(inv_freq);
  gx.Upload(x);
  RopeTables(gcos.t, gsin.t, gpos.t, gfreq.t);
  ExpectClose("rope_cos", gcos.Download(), cos);
  ExpectClose("rope_sin", gsin.Download(), sin);
  RopeApply(gx.t, heads, D, gcos.t, gsin.t, false);
  ExpectClose("rope_apply", gx.Download(), rotated);
  RopeApply(gx.t, heads, D, gcos.t, gsin.t, true);  // the inverse undoes it
  ExpectClose("rope_inverse", gx.Download(), x);
}

TEST_P(CudaKernelTest, SwiGluAndEmbeddingMatchCpu) {
  const int64_t T = 21, I = 72, V = 50, C = 40;
  auto gate_up = AsStored(Random(T * 2 * I, 16), dt()), dact = AsStored(Random(T * I, 17), dt());
  std::vector<float> act(T * I), dgate_up(T * 2 * I);
  SwiGluForward(View(act, {T, I}), View(gate_up, {T, 2 * I}));
  SwiGluBackward(View(dgate_up, {T, 2 * I}), View(dact, {T, I}), View(gate_up, {T, 2 * I}));
  DeviceTensor ggu(dt(), {T, 2 * I}), gact(dt(), {T, I}), gdact(dt(), {T, I}),
      gdgu(dt(), {T, 2 * I});
  ggu.Upload(gate_up);
  gdact.Upload(dact);
  SwiGluForward(gact.t, ggu.t);
  SwiGluBackward(gdgu.t, gdact.t, ggu.t);
  ExpectClose("swiglu_act", gact.Download(), act);
  ExpectClose("swiglu_dgate_up", gdgu.Download(), dgate_up);

  std::vector<int32_t> tokens(T);
  for (int64_t t = 0; t < T; ++t) tokens[t] = static_cast<int32_t>((t * 7) % V);  // repeats
  auto table = AsStored(Random(V * C, 18), dt()), dout = AsStored(Random(T * C, 19), dt());
  auto dtable0 = Random(V * C, 20);
  std::vector<float> out(T * C), dtable = dtable0;
  EmbeddingForward(View(out, {T, C}), View(table, {V, C}), View(tokens, {T}));
  EmbeddingBackward(View(dtable, {V, C}), View(dout, {T, C}), View(tokens, {T}));
  DeviceTensor gtok(DType::kI32, {T}), gtab(dt(), {V, C}), gout(dt(), {T, C}), gdout(dt(), {T, C}),
      gdtab(DType::kF32, {V, C});
  gtok.Upload(tokens);
  gtab.Upload(table);
  gdout.Upload(dout);
  gdtab.Upload(dtable0);
  EmbeddingForward(gout.t, gtab.t, gtok.t);
  EmbeddingBackward(gdtab.t, gdout.t, gtok.t);
  ExpectClose("embedding_out", gout.Download(), out);
  ExpectClose("embedding_dtable", gdtab.Download(), dtable);
}

// Regression: element-per-thread kernels were launched with a capped grid, leaving every
// element past 524,280 x 256 (~134M) unwritten, e.g. SwiGLU at 15,000 tokens x I 9,000.
TEST_P(CudaKernelTest, ElementPerThreadKernelsWriteEveryElementOfHugeTensors) {
  const int64_t T = 15000, I = 9000;  // T * I = 135M > 134,215,680
  DeviceTensor gate_up(dt(), {T, 2 * I}), act(dt(), {T, I});
  cuda::Fill(0, dt(), gate_up.t.data, gate_up.t.numel(), 0.5f);
  SwiGluForward(act.t, gate_up.t);
  const std::vector<float> got = act.Download();
  const float want = AsStored({0.5f / (1.0f + std::exp(-0.5f)) * 0.5f}, dt())[0];
  for (const int64_t i : {int64_t{0}, T * I / 2, T * I - 1}) {
    EXPECT_NEAR(got[i], want, 1e-2 * want) << "element " << i;
  }
  int64_t unwritten = 0;
  for (float x : got) unwritten += std::isnan(x) ? 1 : 0;
  EXPECT_EQ(unwritten, 0);
}

struct AttentionCase {
  std::vector<int32_t> lengths;
  int64_t H, KV, D;
};

TEST_P(CudaKernelTest, AttentionForwardAndBackwardMatchCpu) {
  for (const AttentionCase& c : std::vector<AttentionCase>{
           {{1, 17, 64, 129, 30}, 8, 2, 64}, {{5, 40, 3}, 4, 1, 16}, {{33, 70}, 4, 4, 128}}) {
    std::vector<int32_t> cu = {0};
    for (int32_t l : c.lengths) cu.push_back(cu.back() + l);
    const int64_t T = cu.back(), B = static_cast<int64_t>(c.lengths.size());
    const int64_t width = (c.H + 2 * c.KV) * c.D, HD = c.H * c.D;
    const AttentionShape shape{c.H, c.KV, c.D};
    auto qkv = AsStored(Random(T * width, 21), dt()), dout = AsStored(Random(T * HD, 22), dt());
    std::vector<float> out(T * HD), lse(T * c.H), dqkv(T * width);
    AttentionForward(View(out, {T, HD}), View(lse, {T, c.H}), View(qkv, {T, width}),
                     View(cu, {B + 1}), shape);
    // The backward uses the forward's output as the GPU stores it (bf16-rounded).
    auto out_stored = AsStored(out, dt());
    AttentionBackward(View(dqkv, {T, width}), View(dout, {T, HD}), View(qkv, {T, width}),
                      View(out_stored, {T, HD}), View(lse, {T, c.H}), View(cu, {B + 1}), shape);
    DeviceTensor gqkv(dt(), {T, width}), gout(dt(), {T, HD}), glse(DType::kF32, {T, c.H}),
        gcu(DType::kI32, {B + 1}), gdout(dt(), {T, HD}), gdqkv(dt(), {T, width});
    gqkv.Upload(qkv);
    gcu.Upload(cu);
    gdout.Upload(dout);
    AttentionForward(gout.t, glse.t, gqkv.t, gcu.t, shape);
    ExpectClose("attention_out", gout.Download(), out);
    ExpectClose("attention_lse", glse.Download(), lse);
    gout.Upload(out_stored);
    AttentionBackward(gdqkv.t, gdout.t, gqkv.t, gout.t, glse.t, gcu.t, shape);
    ExpectClose("attention_dqkv", gdqkv.Download(), dqkv);
  }
}

TEST_P(CudaKernelTest, LogprobForwardAndBackwardMatchCpuAcrossChunks) {
  const int64_t R = 45, V = 1000, C = 64, chunk = 16;
  const float temperature = 0.7f;
  auto h = AsStored(Random(R * C, 23), dt()), W = AsStored(Random(V * C, 24, 0.3f), dt());
  auto dlogprob = Random(R, 25), dW0 = Random(V * C, 26);
  std::vector<int32_t> targets(R);
  for (int64_t r = 0; r < R; ++r) targets[r] = static_cast<int32_t>((r * 131) % V);
  std::vector<float> logprob(R), lse(R), scratch(chunk * V), dh(R * C), dW = dW0;
  LogprobForward(View(logprob, {R}), View(lse, {R}), View(h, {R, C}), View(W, {V, C}),
                 View(targets, {R}), temperature, View(scratch, {chunk, V}));
  LogprobBackward(View(dh, {R, C}), View(dW, {V, C}), View(dlogprob, {R}), View(h, {R, C}),
                  View(W, {V, C}), View(targets, {R}), View(lse, {R}), temperature,
                  View(scratch, {chunk, V}));
  DeviceTensor gh(dt(), {R, C}), gW(dt(), {V, C}), gt(DType::kI32, {R}), glp(DType::kF32, {R}),
      glse(DType::kF32, {R}), gscratch(DType::kF32, {chunk, V}), gdlp(DType::kF32, {R}),
      gdh(dt(), {R, C}), gdW(DType::kF32, {V, C});
  gh.Upload(h);
  gW.Upload(W);
  gt.Upload(targets);
  gdlp.Upload(dlogprob);
  gdW.Upload(dW0);
  LogprobForward(glp.t, glse.t, gh.t, gW.t, gt.t, temperature, gscratch.t);
  ExpectClose("logprob", glp.Download(), logprob);
  ExpectClose("logprob_lse", glse.Download(), lse);
  LogprobBackward(gdh.t, gdW.t, gdlp.t, gh.t, gW.t, gt.t, glse.t, temperature, gscratch.t);
  ExpectClose("logprob_dh", gdh.Download(), dh);
  ExpectClose("logprob_dW", gdW.Download(), dW);
}

TEST_P(CudaKernelTest, AdamWSgdAndSumOfSquaresMatchCpu) {
  if (dt() != DType::kF32) GTEST_SKIP() << "optimizer state is F32 in both modes";
  const int64_t n = 100'003;
  auto p = Random(n, 27), g = Random(n, 28), m = Random(n, 29, 0.1f), v = Random(n, 30, 0.1f);
  for (float& x : v) x = std::fabs(x);
  AdamWStep step;
  step.lr = 1e-3f;
  step.weight_decay = 0.1f;
  step.step = 7;
  step.grad_scale = 0.5f;
  std::vector<float> p1 = p, m1 = m, v1 = v;
  AdamWUpdate(View(p1, {n}), View(g, {n}), View(m1, {n}), View(v1, {n}), 10, n - 10, true, step);
  DeviceTensor gp(DType::kF32, {n}), gg(DType::kF32, {n}), gm(DType::kF32, {n}),
      gv(DType::kF32, {n});
  gp.Upload(p);
  gg.Upload(g);
  gm.Upload(m);
  gv.Upload(v);
  AdamWUpdate(gp.t, gg.t, gm.t, gv.t, 10, n - 10, true, step);
  ExpectClose("adamw_p", gp.Download(), p1);
  ExpectClose("adamw_m", gm.Download(), m1);
  ExpectClose("adamw_v", gv.Download(), v1);
  std::vector<float> p2 = p;
  SgdUpdate(View(p2, {n}), View(g, {n}), 0, n, true, 0.01f, 0.1f, 0.5f);
  gp.Upload(p);
  SgdUpdate(gp.t, gg.t, 0, n, true, 0.01f, 0.1f, 0.5f);
  ExpectClose("sgd_p", gp.Download(), p2);
  const double want = SumOfSquares(View(g, {n}));
  const double got = SumOfSquares(gg.t);
  EXPECT_NEAR(got, want, 1e-9 * want);
  EXPECT_EQ(SumOfSquares(gg.t), got) << "the GPU sum of squares is deterministic";
}

// The bf16 mode's optimizer step: the fp32 master update as in AdamWUpdate, plus the BF16
// compute copy, which must be exactly the updated master weights rounded to nearest even.
TEST_P(CudaKernelTest, AdamWWithBf16CopyWritesTheRoundedUpdateInItsRange) {
  if (dt() != DType::kF32) GTEST_SKIP() << "one run covers it: the master weights are F32";
  const int64_t n = 50'001, begin = 7, end = n - 3;
  auto p = Random(n, 32), g = Random(n, 33), m = Random(n, 34, 0.1f), v = Random(n, 35, 0.1f);
  for (float& x : v) x = std::fabs(x);
  AdamWStep step;
  step.lr = 2e-3f;
  step.weight_decay = 0.05f;
  step.step = 3;
  std::vector<float> p1 = p, m1 = m, v1 = v;
  AdamWUpdate(View(p1, {n}), View(g, {n}), View(m1, {n}), View(v1, {n}), begin, end, true, step);
  DeviceTensor gp(DType::kF32, {n}), gg(DType::kF32, {n}), gm(DType::kF32, {n}),
      gv(DType::kF32, {n}), gcopy(DType::kBF16, {n});
  gp.Upload(p);
  gg.Upload(g);
  gm.Upload(m);
  gv.Upload(v);
  AdamWUpdateWithBf16Copy(gp.t, gg.t, gm.t, gv.t, gcopy.t, begin, end, true, step);
  const std::vector<float> got_p = gp.Download(), got_copy = gcopy.Download();
  ExpectClose("adamw_bf16copy_p", got_p, p1);
  ExpectClose("adamw_bf16copy_m", gm.Download(), m1);
  for (int64_t i = 0; i < n; ++i) {
    if (i < begin || i >= end) {
      ASSERT_TRUE(std::isnan(got_copy[i])) << "outside the range, element " << i;
    } else {
      ASSERT_EQ(got_copy[i], Bf16ToF32(F32ToBf16(got_p[i]))) << "element " << i;
    }
  }
}

// Bias and RMSNorm weight gradients are column sums over row chunks: many chunks, a ragged
// last chunk and a column count that is not a multiple of the 32-column tile.
TEST_P(CudaKernelTest, ColumnReductionsOverManyRowChunksMatchCpu) {
  const int64_t M = 1000, N = 77, K = 24;
  auto a = AsStored(Random(M * K, 36), dt()), w = AsStored(Random(N * K, 37), dt()),
       dout = AsStored(Random(M * N, 38), dt());
  auto db0 = Random(N, 39), dw0 = Random(N * K, 40);
  std::vector<float> dw = dw0, db = db0;
  MatmulBackward(Tensor(), View(dw, {N, K}), View(db, {N}), View(dout, {M, N}), View(a, {M, K}),
                 View(w, {N, K}));
  DeviceTensor ga(dt(), {M, K}), gw(dt(), {N, K}), gdout(dt(), {M, N}), gdw(DType::kF32, {N, K}),
      gdb(DType::kF32, {N});
  ga.Upload(a);
  gw.Upload(w);
  gdout.Upload(dout);
  gdw.Upload(dw0);
  gdb.Upload(db0);
  MatmulBackward(Tensor(), gdw.t, gdb.t, gdout.t, ga.t, gw.t);
  ExpectClose("colsum_dbias", gdb.Download(), db);
  ExpectClose("colsum_dw", gdw.Download(), dw);

  const int64_t T = 301, C = 77;
  auto x = AsStored(Random(T * C, 41), dt()), nw = AsStored(Random(C, 42, 0.5f), dt()),
       dy = AsStored(Random(T * C, 43), dt()), dx0 = AsStored(Random(T * C, 44), dt());
  auto ndw0 = Random(C, 45);
  std::vector<float> y(T * C), rstd(T), dx = dx0, ndw = ndw0;
  RmsNormForward(View(y, {T, C}), View(rstd, {T}), View(x, {T, C}), View(nw, {C}), 1e-5f);
  RmsNormBackward(View(dx, {T, C}), View(ndw, {C}), View(dy, {T, C}), View(x, {T, C}),
                  View(nw, {C}), View(rstd, {T}));
  DeviceTensor gx(dt(), {T, C}), gnw(dt(), {C}), gy(dt(), {T, C}), grstd(DType::kF32, {T}),
      gdy(dt(), {T, C}), gdx(dt(), {T, C}), gndw(DType::kF32, {C});
  gx.Upload(x);
  gnw.Upload(nw);
  gdy.Upload(dy);
  gdx.Upload(dx0);
  gndw.Upload(ndw0);
  RmsNormForward(gy.t, grstd.t, gx.t, gnw.t, 1e-5f);
  RmsNormBackward(gdx.t, gndw.t, gdy.t, gx.t, gnw.t, grstd.t);
  ExpectClose("colsum_rmsnorm_y", gy.Download(), y);
  ExpectClose("colsum_rmsnorm_dx", gdx.Download(), dx);
  ExpectClose("colsum_rmsnorm_dw", gndw.Download(), ndw);
  // Deterministic: a second backward from the same state adds exactly the same dw.
  const std::vector<float> once = gndw.Download();
  gndw.Upload(ndw0);
  gdx.Upload(dx0);
  RmsNormBackward(gdx.t, gndw.t, gdy.t, gx.t, gnw.t, grstd.t);
  EXPECT_EQ(gndw.Download(), once);
}

INSTANTIATE_TEST_SUITE_P(Modes, CudaKernelTest, ::testing::Values(DType::kF32, DType::kBF16),
                         [](const auto& info) { return std::string(DTypeName(info.param)); });
#endif  // PRL_WITH_CUDA

// The conversion that makes the bf16 mode's compute weights: round to nearest even, on every
// backend (the GPU's result must equal the CPU's bit for bit).
TEST(ConvertDTypeTest, F32ToBf16RoundsToNearestEvenAndBackIsExact) {
  std::vector<float> x = Random(1001, 31, 3.0f);
  x[0] = 1.0f + 1.0f / 256;  // a tie: rounds to even (1.0)
  std::vector<uint16_t> half(x.size());
  std::vector<float> back(x.size());
  ConvertDType(Tensor(half.data(), DType::kBF16, Device::Cpu(), {1001}), View(x, {1001}));
  ConvertDType(View(back, {1001}), Tensor(half.data(), DType::kBF16, Device::Cpu(), {1001}));
  EXPECT_EQ(back[0], 1.0f);
  for (size_t i = 0; i < x.size(); ++i) {
    ASSERT_EQ(half[i], F32ToBf16(x[i])) << i;
    ASSERT_EQ(back[i], Bf16ToF32(half[i])) << i;
  }
#if PRL_WITH_CUDA
  if (CudaDeviceCount() == 0) return;
  DeviceTensor gx(DType::kF32, {1001}), gh(DType::kBF16, {1001});
  gx.Upload(x);
  ConvertDType(gh.t, gx.t);
  EXPECT_EQ(gh.Download(), back);
#endif
}

// Runs everywhere: the dispatcher's device check fires before any backend is touched.
TEST(CudaDispatchDeathTest, TensorsOnDifferentDevicesAreRefusedNamingBoth) {
  float host[4] = {};
  static float fake_device[4];
  const Tensor cpu_out(host, DType::kF32, Device::Cpu(), {2, 2});
  const Tensor gpu_a(fake_device, DType::kF32, Device::Cuda(0), {2, 2});
  const Tensor gpu_w(fake_device, DType::kF32, Device::Cuda(0), {2, 2});
  EXPECT_DEATH(MatmulForward(cpu_out, gpu_a, gpu_w), "tensors on cpu and cuda:0");
}

// The dispatchers keep the CPU backend F32-only: BF16 on the CPU is refused with its name.
TEST(CudaDispatchDeathTest, Bf16OnTheCpuIsRefusedNamingTheTensorAndDtype) {
  uint16_t x[4] = {}, y[4] = {};
  const Tensor in(x, DType::kBF16, Device::Cpu(), {2, 2});
  const Tensor out(y, DType::kBF16, Device::Cpu(), {2, 2});
  EXPECT_DEATH(SwiGluForward(Tensor(y, DType::kBF16, Device::Cpu(), {2, 1}), in),
               "gate_up has dtype BF16, expected F32");
  EXPECT_DEATH(AddInPlace(out, in), "dst has dtype BF16, expected F32");
}

}  // namespace
}  // namespace prl::kernels
