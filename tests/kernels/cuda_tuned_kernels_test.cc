// The engine's tuned decode kernels on CUDA (EngineOptions::tuned_kernels), each against the
// kernel or the CPU result it replaces: the split-vocabulary sampler (the transformed
// distribution's frequencies and log-probs, the one-block sampler's tokens for the same draws,
// greedy and filtered rows untouched), the fused RoPE + KV-cache write (the bits of RopeApply
// then KvCacheWrite), decode attention without the tile plan (the CPU's attention; the
// batch-invariant order's bits), and the residual GEMM with cuBLASLt's algorithm search (the
// CPU's product). Skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <numeric>
#include <random>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "kernels/attention.h"
#include "kernels/matmul.h"
#include "kernels/norm_matmul.h"
#include "kernels/rmsnorm.h"
#include "kernels/paged_attention.h"
#include "kernels/rope.h"
#include "kernels/sampling.h"
#include "tests/kernels/cuda_test_util.h"
#include "tests/kernels/tensor_util.h"

namespace prl::kernels {
namespace {

using testing::AsStored;
using testing::BitEqual;
using testing::Random;
using testing::RelativeError;
using testing::View;

#if PRL_WITH_CUDA
using testing::DeviceTensor;

struct Drawn {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
};

Drawn SampleOnGpu(const std::vector<float>& logits, const std::vector<SamplingRow>& rows, int64_t V,
                  bool split) {
  const int64_t R = static_cast<int64_t>(rows.size());
  DeviceTensor d_logits(DType::kF32, {R, V}), d_rows(DType::kI32, {R, kSamplingRowWords});
  DeviceTensor d_tokens(DType::kI32, {R}), d_logprobs(DType::kF32, {R});
  d_logits.Upload(logits);
  std::vector<int32_t> words(R * kSamplingRowWords);
  std::memcpy(words.data(), rows.data(), words.size() * sizeof(int32_t));
  d_rows.Upload(words);
  SampleTokens(d_tokens.t, d_logprobs.t, d_logits.t, d_rows.t, split);
  Drawn d{std::vector<int32_t>(R), d_logprobs.Download()};
  const std::vector<float> tokens = d_tokens.Download();  // I32 converted to float
  for (int64_t r = 0; r < R; ++r) d.tokens[r] = static_cast<int32_t>(tokens[r]);
  return d;
}

// A vocabulary of 5000 (three splits of 2048) whose mass sits on ten tokens spread over every
// split: 20k draws of the split sampler match the float64 softmax within 4.5 sigma, and each
// log-prob is the token's log-probability.
TEST(CudaSplitSamplerTest, FrequenciesAndLogprobsMatchTheSoftmaxAcrossSplits) {
  PRL_SKIP_WITHOUT_GPU();
  const int64_t V = 5000, R = 20000;
  std::vector<float> row(V, -40.0f);
  const int64_t heavy[] = {3, 1000, 2047, 2048, 2500, 3000, 4095, 4096, 4100, 4999};
  const float values[] = {1.0f, 0.5f, 2.0f, -0.5f, 1.5f, 0.0f, 1.2f, 0.8f, 2.2f, -1.0f};
  for (int i = 0; i < 10; ++i) row[heavy[i]] = values[i];
  const float temperature = 0.9f;
  std::vector<double> probs(V);
  double total = 0.0;
  for (int64_t v = 0; v < V; ++v) total += std::exp(double{row[v] * (1.0f / temperature)});
  for (int64_t v = 0; v < V; ++v)
    probs[v] = std::exp(double{row[v] * (1.0f / temperature)}) / total;
  std::vector<float> logits(R * V);
  std::vector<SamplingRow> rows(R);
  for (int64_t r = 0; r < R; ++r) {
    std::copy(row.begin(), row.end(), logits.begin() + r * V);
    rows[r].temperature = temperature;
    rows[r].seed = 77;
    rows[r].index = static_cast<uint64_t>(r);
  }
  const Drawn d = SampleOnGpu(logits, rows, V, /*split=*/true);
  std::map<int32_t, int64_t> counts;
  for (int64_t r = 0; r < R; ++r) {
    ASSERT_GE(d.tokens[r], 0);
    ASSERT_LT(d.tokens[r], V);
    ++counts[d.tokens[r]];
    ASSERT_NEAR(d.logprobs[r], std::log(probs[d.tokens[r]]), 1e-5) << "token " << d.tokens[r];
  }
  for (int64_t v : heavy) {
    const double expected = probs[v] * R, sigma = std::sqrt(R * probs[v] * (1 - probs[v]));
    EXPECT_NEAR(counts[v], expected, 4.5 * sigma + 1) << "token " << v;
  }
}

// Qwen's vocabulary of 151936 and 256 rows of random logits: the split sampler draws the
// one-block sampler's token for the same u (the same inverse CDF in id order) in all but a
// rounding-boundary few, with log-probs within 1e-5; greedy, top-k and top-p rows in the same
// batch are the one-block kernel's, bit for bit.
TEST(CudaSplitSamplerTest, DrawsTheOneBlockSamplersTokensAndLeavesOtherRowsAlone) {
  PRL_SKIP_WITHOUT_GPU();
  const int64_t V = 151936, R = 256;
  const std::vector<float> logits = Random(R * V, 5, 2.0f);
  std::vector<SamplingRow> rows(R);
  for (int64_t r = 0; r < R; ++r) {
    rows[r].temperature = r % 8 == 7 ? 0.0f : 0.7f + 0.01f * static_cast<float>(r % 50);
    if (r % 8 == 5) rows[r].top_k = 40;
    if (r % 8 == 6) rows[r].top_p = 0.9f;
    rows[r].seed = 11;
    rows[r].stream = static_cast<uint64_t>(r);
  }
  const Drawn split = SampleOnGpu(logits, rows, V, true);
  const Drawn block = SampleOnGpu(logits, rows, V, false);
  int64_t plain = 0, same = 0;
  for (int64_t r = 0; r < R; ++r) {
    if (r % 8 >= 5) {
      EXPECT_EQ(split.tokens[r], block.tokens[r]) << "row " << r;
      EXPECT_EQ(std::memcmp(&split.logprobs[r], &block.logprobs[r], sizeof(float)), 0)
          << "row " << r;
      continue;
    }
    ++plain;
    if (split.tokens[r] != block.tokens[r]) continue;
    ++same;
    EXPECT_NEAR(split.logprobs[r], block.logprobs[r], 1e-5) << "row " << r;
  }
  EXPECT_GE(same, plain - 2) << same << " of " << plain << " plain rows drew the same token";
}

// RopeKvCacheWrite leaves qkv and both caches exactly as RopeApply then KvCacheWrite do,
// skipping negative slots.
TEST(CudaTunedKernelsTest, FusedRopeAndKvWriteEqualsTheTwoCallsBitForBit) {
  PRL_SKIP_WITHOUT_GPU();
  const int64_t H = 14, KV = 2, D = 64, bs = 16, T = 37, num_blocks = 8;
  const int64_t width = (H + 2 * KV) * D, half = D / 2;
  const AttentionShape shape{H, KV, D};
  std::vector<int32_t> positions(T), slots(T);
  for (int64_t t = 0; t < T; ++t) {
    positions[t] = static_cast<int32_t>(3 * t + 100);
    slots[t] = t % 9 == 4 ? -1 : static_cast<int32_t>((t * 5) % (num_blocks * bs));
  }
  std::vector<float> inv_freq(half);
  for (int64_t i = 0; i < half; ++i) {
    inv_freq[i] = static_cast<float>(std::pow(1e6, -2.0 * static_cast<double>(i) / D));
  }
  for (DType dt : {DType::kF32, DType::kBF16}) {
    const std::vector<float> qkv = AsStored(Random(T * width, 3), dt);
    DeviceTensor d_pos(DType::kI32, {T}), d_freq(DType::kF32, {half});
    DeviceTensor cos(DType::kF32, {T, half}), sin(DType::kF32, {T, half}),
        d_slots(DType::kI32, {T});
    d_pos.Upload(positions);
    d_freq.Upload(inv_freq);
    d_slots.Upload(slots);
    RopeTables(cos.t, sin.t, d_pos.t, d_freq.t);
    std::vector<float> results[2][3];
    for (int fused = 0; fused < 2; ++fused) {
      DeviceTensor d_qkv(dt, {T, width});
      DeviceTensor k_cache(dt, {num_blocks, KV, bs, D}), v_cache(dt, {num_blocks, KV, bs, D});
      d_qkv.Upload(qkv);
      if (fused == 1) {
        RopeKvCacheWrite(k_cache.t, v_cache.t, d_qkv.t, d_slots.t, cos.t, sin.t, shape);
      } else {
        RopeApply(d_qkv.t, H + KV, D, cos.t, sin.t, /*inverse=*/false);
        KvCacheWrite(k_cache.t, v_cache.t, d_qkv.t, d_slots.t, shape);
      }
      results[fused][0] = d_qkv.Download();
      results[fused][1] = k_cache.Download();  // NaN-poisoned where nothing was written
      results[fused][2] = v_cache.Download();
    }
    SCOPED_TRACE(DTypeName(dt));
    EXPECT_TRUE(BitEqual(results[0][0], results[1][0])) << "qkv";
    for (int c = 1; c < 3; ++c) {
      ASSERT_EQ(results[0][c].size(), results[1][c].size());
      EXPECT_EQ(std::memcmp(results[0][c].data(), results[1][c].data(),
                            results[0][c].size() * sizeof(float)),
                0)
          << (c == 1 ? "k cache" : "v cache");
    }
  }
}

struct DecodeShape {
  int64_t H, KV, D;
};

// Decode rows (one per sequence, the last token of each of `lengths`) without the tile plan:
// the CPU's attention within the mode's tolerance, and in the batch-invariant order the
// planned kernel's bits.
void CheckDecodeRows(const DecodeShape& sh, const std::vector<int32_t>& lengths) {
  const int64_t H = sh.H, KV = sh.KV, D = sh.D, bs = 16, width = (H + 2 * KV) * D, HD = H * D;
  const int64_t B = static_cast<int64_t>(lengths.size());
  const AttentionShape shape{H, KV, D};
  int64_t max_blocks = 0;
  for (int32_t l : lengths) max_blocks = std::max<int64_t>(max_blocks, (l + bs - 1) / bs);
  const int64_t num_blocks = B * max_blocks;
  for (DType dt : {DType::kF32, DType::kBF16}) {
    std::vector<int32_t> cu = {0};
    for (int32_t l : lengths) cu.push_back(cu.back() + l);
    const int64_t T_full = cu.back();
    const std::vector<float> qkv = AsStored(Random(T_full * width, 8, 0.5f), dt);
    std::vector<float> out_full(T_full * HD), lse_full(T_full * H), want;
    AttentionForward(View(out_full, {T_full, HD}), View(lse_full, {T_full, H}),
                     View(const_cast<std::vector<float>&>(qkv), {T_full, width}), View(cu, {B + 1}),
                     shape);
    std::vector<int32_t> tables(B * max_blocks), slots, q_start(B + 1), context(lengths);
    std::iota(tables.begin(), tables.end(), 0);
    std::shuffle(tables.begin(), tables.end(), std::mt19937(3));
    std::iota(q_start.begin(), q_start.end(), 0);
    std::vector<float> last_rows;
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t p = 0; p < lengths[b]; ++p) {
        slots.push_back(tables[b * max_blocks + p / bs] * static_cast<int32_t>(bs) +
                        static_cast<int32_t>(p % bs));
      }
      const int64_t last = cu[b + 1] - 1;
      want.insert(want.end(), out_full.begin() + last * HD, out_full.begin() + (last + 1) * HD);
      last_rows.insert(last_rows.end(), qkv.begin() + last * width,
                       qkv.begin() + (last + 1) * width);
    }
    DeviceTensor k_cache(dt, {num_blocks, KV, bs, D}), v_cache(dt, {num_blocks, KV, bs, D});
    DeviceTensor d_all(dt, {T_full, width}), d_slots(DType::kI32, {T_full});
    DeviceTensor d_step(dt, {B, width}), d_tables(DType::kI32, {B, max_blocks});
    DeviceTensor d_q(DType::kI32, {B + 1}), d_context(DType::kI32, {B}), d_out(dt, {B, HD});
    d_all.Upload(qkv);
    d_slots.Upload(slots);
    KvCacheWrite(k_cache.t, v_cache.t, d_all.t, d_slots.t, shape);
    d_step.Upload(last_rows);
    d_tables.Upload(tables);
    d_q.Upload(q_start);
    d_context.Upload(context);
    std::vector<float> got[2][2];  // [invariant][single_token_rows]
    for (int inv = 0; inv < 2; ++inv) {
      for (int single = 0; single < 2; ++single) {
        testing::Poison(d_out.t);
        PagedAttentionForward(
            d_out.t, d_step.t, k_cache.t, v_cache.t, d_tables.t, d_q.t, d_context.t, shape,
            inv ? ReductionOrder::kBatchInvariant : ReductionOrder::kFast, single == 1);
        got[inv][single] = d_out.Download();
      }
    }
    SCOPED_TRACE(::testing::Message() << DTypeName(dt) << " H" << H << " KV" << KV << " D" << D);
    EXPECT_LE(RelativeError(got[0][1], want), testing::Tolerance(dt));
    EXPECT_LE(RelativeError(got[1][1], want), testing::Tolerance(dt));
    EXPECT_TRUE(BitEqual(got[1][0], got[1][1])) << "batch-invariant bits changed";
  }
}

// A few sequences: the context is split over CTAs (flash decoding) and the splits merged. GQA
// 7:1 (Qwen2.5-0.5B), 8:1 at head_dim 128, MHA, and 16:1 (BF16: the tensor-core kernel's
// largest group; F32: beyond the SIMT kernel's 8, the row kernel without the plan).
TEST(CudaTunedKernelsTest, DecodeAttentionWithoutTilePlanMatchesCpuAndPlannedBits) {
  PRL_SKIP_WITHOUT_GPU();
  for (const DecodeShape sh : {DecodeShape{14, 2, 64}, DecodeShape{8, 1, 128},
                               DecodeShape{4, 4, 64}, DecodeShape{16, 1, 64}}) {
    CheckDecodeRows(sh, {1, 17, 300, 700, 64, 33});
  }
}

// Enough sequences to fill the GPU without splitting the context (one CTA per sequence and kv
// head writes the output itself), with lengths that end inside and at the edge of key tiles.
TEST(CudaTunedKernelsTest, DecodeAttentionOfALargeBatchMatchesCpuWithoutSplits) {
  PRL_SKIP_WITHOUT_GPU();
  std::mt19937 rng(11);
  std::vector<int32_t> lengths(600);
  for (int32_t& l : lengths) l = 1 + static_cast<int32_t>(rng() % 96);
  lengths[0] = 32;
  lengths[1] = 64;
  for (const DecodeShape sh : {DecodeShape{14, 2, 64}, DecodeShape{16, 2, 128}}) {
    CheckDecodeRows(sh, lengths);
  }
}

// out = residual + a . w^T with the residual as cuBLASLt's C operand, into another buffer and in
// place, with and without the algorithm search: the CPU's product within the mode's tolerance.
TEST(CudaTunedKernelsTest, ResidualGemmWithAlgorithmSearchMatchesCpu) {
  PRL_SKIP_WITHOUT_GPU();
  const bool before = GemmAlgorithmSearch();
  for (bool search : {false, true}) {
    SetGemmAlgorithmSearch(search);
    for (DType dt : {DType::kF32, DType::kBF16}) {
      for (int64_t M : {1, 7, 64, 256}) {
        const int64_t N = 896, K = 4864;
        auto a = AsStored(Random(M * K, 1, 0.1f), dt), w = AsStored(Random(N * K, 2, 0.1f), dt),
             residual = AsStored(Random(M * N, 3), dt);
        std::vector<float> want = residual;
        MatmulForward(View(want, {M, N}), View(a, {M, K}), View(w, {N, K}), {}, true);
        DeviceTensor da(dt, {M, K}), dw(dt, {N, K}), dres(dt, {M, N}), dout(dt, {M, N});
        da.Upload(a);
        dw.Upload(w);
        dres.Upload(residual);
        MatmulResidualForward(dout.t, da.t, dw.t, dres.t);
        SCOPED_TRACE(::testing::Message() << DTypeName(dt) << " M=" << M << " search=" << search);
        EXPECT_LE(RelativeError(dout.Download(), want), testing::Tolerance(dt));
        EXPECT_EQ(dres.Download(), residual) << "the residual operand was written";
        MatmulResidualForward(dres.t, da.t, dw.t, dres.t);  // in place
        EXPECT_LE(RelativeError(dres.Download(), want), testing::Tolerance(dt));
      }
    }
  }
  SetGemmAlgorithmSearch(before);
}

// The skinny GEMM (every row count it takes, 1..8, and 9, which cuBLASLt keeps): the CPU's
// product within BF16's tolerance with a bias, accumulating, as a residual product in place,
// and into F32 (the LM head's logits), for N not a multiple of the 8 warps of a block and K
// not a multiple of the 32 x 4 chunks a warp reads per pass.
TEST(CudaTunedKernelsTest, SkinnyGemmMatchesCpuForEveryRowCount) {
  PRL_SKIP_WITHOUT_GPU();
  SetSkinnyGemm(true);
  const DType dt = DType::kBF16;
  for (int64_t M = 1; M <= 9; ++M) {
    const std::pair<int64_t, int64_t> shapes[] = {{901, 896}, {300, 4864}, {37, 8}};  // N, K
    for (const auto& [N, K] : shapes) {
      auto a = AsStored(Random(M * K, 1, 0.1f), dt), w = AsStored(Random(N * K, 2, 0.1f), dt),
           bias = AsStored(Random(N, 4), dt), residual = AsStored(Random(M * N, 3), dt);
      std::vector<float> with_bias(M * N), accumulated = residual;
      MatmulForward(View(with_bias, {M, N}), View(a, {M, K}), View(w, {N, K}), View(bias, {N}));
      MatmulForward(View(accumulated, {M, N}), View(a, {M, K}), View(w, {N, K}), {}, true);
      DeviceTensor da(dt, {M, K}), dw(dt, {N, K}), db(dt, {N}), dres(dt, {M, N}), dout(dt, {M, N}),
          dlogits(DType::kF32, {M, N});
      da.Upload(a);
      dw.Upload(w);
      db.Upload(bias);
      dres.Upload(residual);
      SCOPED_TRACE(::testing::Message() << "M=" << M << " N=" << N << " K=" << K);
      MatmulForward(dout.t, da.t, dw.t, db.t);
      EXPECT_LE(RelativeError(dout.Download(), with_bias), testing::Tolerance(dt));
      dout.Upload(residual);
      MatmulForward(dout.t, da.t, dw.t, {}, /*accumulate=*/true);
      EXPECT_LE(RelativeError(dout.Download(), accumulated), testing::Tolerance(dt));
      MatmulResidualForward(dres.t, da.t, dw.t, dres.t);  // in place
      EXPECT_LE(RelativeError(dres.Download(), accumulated), testing::Tolerance(dt));
      std::vector<float> logits(M * N);
      MatmulForward(View(logits, {M, N}), View(a, {M, K}), View(w, {N, K}));
      MatmulForward(dlogits.t, da.t, dw.t);
      EXPECT_LE(RelativeError(dlogits.Download(), logits), 1e-5) << "F32 output";
    }
  }
  SetSkinnyGemm(false);
}

// The default (kernels/cuda/gemm.h): the batch-invariant order's BF16 products on the tensor
// cores through one pinned cuBLASLt algorithm per (N, K). A row gets the same bits alone and
// among 2 to 1500 others (with a bias into BF16, and into F32 as the LM head), and the products
// stay within BF16's tolerance of the CPU's.
TEST(CudaTunedKernelsTest, PinnedAlgorithmGemmGivesARowTheSameBitsWhateverM) {
  PRL_SKIP_WITHOUT_GPU();
  const bool was = kernels::TensorCoreInvariantGemm();
  SetTensorCoreInvariantGemm(true);
  const DType dt = DType::kBF16;
  const std::pair<int64_t, int64_t> shapes[] = {{896, 896}, {4864, 896}, {896, 4864}, {1000, 64}};
  for (const auto& [N, K] : shapes) {
    std::vector<float> w = AsStored(Random(N * K, 2, 0.05f), dt),
                       bias = AsStored(Random(N, 4), dt), row = AsStored(Random(K, 7), dt);
    DeviceTensor dw(dt, {N, K}), db(dt, {N});
    dw.Upload(w);
    db.Upload(bias);
    std::vector<float> alone, alone_f32;
    for (int64_t M : {1, 2, 7, 64, 300, 1500}) {
      SCOPED_TRACE(::testing::Message() << "N=" << N << " K=" << K << " M=" << M);
      std::vector<float> a = AsStored(Random(M * K, 10 + static_cast<uint32_t>(M)), dt);
      const int64_t at = M / 2;
      std::copy(row.begin(), row.end(), a.begin() + at * K);
      DeviceTensor da(dt, {M, K}), dout(dt, {M, N}), dlogits(DType::kF32, {M, N});
      da.Upload(a);
      MatmulForward(dout.t, da.t, dw.t, db.t, false, ReductionOrder::kBatchInvariant);
      MatmulForward(dlogits.t, da.t, dw.t, {}, false, ReductionOrder::kBatchInvariant);
      const std::vector<float> out = dout.Download(), logits = dlogits.Download();
      const std::vector<float> got(out.begin() + at * N, out.begin() + (at + 1) * N),
          got_f32(logits.begin() + at * N, logits.begin() + (at + 1) * N);
      if (M == 1) {
        alone = got;
        alone_f32 = got_f32;
        std::vector<float> want(N);
        MatmulForward(View(want, {1, N}), View(a, {1, K}), View(w, {N, K}), View(bias, {N}));
        EXPECT_LE(RelativeError(got, want), testing::Tolerance(dt));
        continue;
      }
      EXPECT_TRUE(BitEqual(got, alone));
      EXPECT_TRUE(BitEqual(got_f32, alone_f32));
    }
  }
  SetTensorCoreInvariantGemm(was);
}

// The RMSNorm fused into the skinny GEMM (kernels/norm_matmul.h): the CPU's RmsNormForward,
// the normalised rows stored in BF16 as the unfused path stores them, then MatmulForward,
// within BF16's tolerance, for every row count 1..8, with a bias into BF16 and without one into
// F32; 9 rows, F32 operands and the batch-invariant order are not taken.
TEST(CudaTunedKernelsTest, NormInGemmMatchesCpuRmsNormThenMatmul) {
  PRL_SKIP_WITHOUT_GPU();
  const DType dt = DType::kBF16;
  const float eps = 1e-6f;
  for (int64_t M = 1; M <= 9; ++M) {
    const std::pair<int64_t, int64_t> shapes[] = {{1152, 896}, {301, 4864}, {37, 8}};  // N, K
    for (const auto& [N, K] : shapes) {
      std::vector<float> g = Random(K, 5, 0.2f);
      for (float& v : g) v += 1.0f;
      g = AsStored(g, dt);
      auto x = AsStored(Random(M * K, 1), dt), w = AsStored(Random(N * K, 2, 0.05f), dt),
           bias = AsStored(Random(N, 4), dt);
      std::vector<float> normalised(M * K), rstd(M), with_bias(M * N), without(M * N);
      RmsNormForward(View(normalised, {M, K}), View(rstd, {M}), View(x, {M, K}), View(g, {K}),
                     eps);
      normalised = AsStored(normalised, dt);
      MatmulForward(View(with_bias, {M, N}), View(normalised, {M, K}), View(w, {N, K}),
                    View(bias, {N}));
      MatmulForward(View(without, {M, N}), View(normalised, {M, K}), View(w, {N, K}));
      DeviceTensor dx(dt, {M, K}), dg(dt, {K}), dw(dt, {N, K}), db(dt, {N}), dout(dt, {M, N}),
          dout32(DType::kF32, {M, N});
      dx.Upload(x);
      dg.Upload(g);
      dw.Upload(w);
      db.Upload(bias);
      SCOPED_TRACE(::testing::Message() << "M=" << M << " N=" << N << " K=" << K);
      const bool supported =
          NormMatmulSupported(dout.t, dx.t, dg.t, dw.t, db.t, ReductionOrder::kFast);
      ASSERT_EQ(supported, M <= 8);
      EXPECT_FALSE(
          NormMatmulSupported(dout.t, dx.t, dg.t, dw.t, db.t, ReductionOrder::kBatchInvariant));
      if (!supported) continue;
      NormMatmulForward(dout.t, dx.t, dg.t, eps, dw.t, db.t);
      EXPECT_LE(RelativeError(dout.Download(), with_bias), testing::Tolerance(dt));
      NormMatmulForward(dout32.t, dx.t, dg.t, eps, dw.t);
      EXPECT_LE(RelativeError(dout32.Download(), without), testing::Tolerance(dt)) << "F32 out";
    }
  }
  DeviceTensor fx(DType::kF32, {2, 8}), fg(DType::kF32, {8}), fw(DType::kF32, {4, 8}),
      fout(DType::kF32, {2, 4});
  EXPECT_FALSE(NormMatmulSupported(fout.t, fx.t, fg.t, fw.t, {}, ReductionOrder::kFast));
}

#else
TEST(CudaTunedKernelsTest, NeedsACudaBuild) { GTEST_SKIP() << "built without CUDA"; }
#endif

}  // namespace
}  // namespace prl::kernels
