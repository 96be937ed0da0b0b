// The engine's paged KV cache on CUDA: KV writes into shuffled blocks, and paged attention of
// a step mixing decode rows and prefill chunks over cached context, against the CPU attention
// of the full sequences (F32 within 1e-5, BF16 within 1e-2 relative, as every CUDA kernel);
// the batch-invariant order equals the learner's packed batch-invariant attention bit for bit,
// and the batch-invariant GEMM and LM-head log-prob give a row the same bits in any batch.
// Skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "kernels/attention.h"
#include "kernels/logprob.h"
#include "kernels/matmul.h"
#include "kernels/paged_attention.h"
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

// Sequences of full length `lengths[b]` whose last `q_lens[b]` rows are this step's.
struct PagedCase {
  std::vector<int32_t> lengths, q_lens;
  int64_t H, KV, D, block_size;
};

struct PagedRun {
  std::vector<float> reference;  // CPU attention of the full sequences, the step's rows
  std::vector<float> paged_fast, paged_invariant, packed_invariant;  // GPU, the step's rows
  std::vector<float> packed_all, reference_all;  // the learner's every row, GPU and CPU
  std::vector<float> packed_lse, reference_lse;  // (T_full, H): the backward's input
};

PagedRun RunPaged(const PagedCase& c, DType dt, uint32_t seed) {
  const int64_t B = static_cast<int64_t>(c.lengths.size()), width = (c.H + 2 * c.KV) * c.D;
  const int64_t HD = c.H * c.D, bs = c.block_size;
  std::vector<int32_t> cu = {0}, q_start = {0};
  for (int64_t b = 0; b < B; ++b) {
    cu.push_back(cu.back() + c.lengths[b]);
    q_start.push_back(q_start.back() + c.q_lens[b]);
  }
  const int64_t T_full = cu.back(), T = q_start.back();
  const std::vector<float> qkv = AsStored(Random(T_full * width, seed, 0.5f), dt);

  // Blocks in shuffled order; sequence b's positions p -> table[b][p / bs].
  int64_t max_blocks = 1, num_blocks = 0;
  for (int32_t l : c.lengths) max_blocks = std::max<int64_t>(max_blocks, (l + bs - 1) / bs);
  num_blocks = B * max_blocks + 3;
  std::vector<int32_t> ids(num_blocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), std::mt19937(seed));
  std::vector<int32_t> tables(B * max_blocks, 0), slots_past, slots_step, context(c.lengths);
  std::vector<float> qkv_past, qkv_step;
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t k = 0; k < max_blocks; ++k) tables[b * max_blocks + k] = ids[b * max_blocks + k];
    for (int64_t p = 0; p < c.lengths[b]; ++p) {
      const int32_t slot = static_cast<int32_t>(tables[b * max_blocks + p / bs] * bs + p % bs);
      const float* row = qkv.data() + (cu[b] + p) * width;
      const bool step = p >= c.lengths[b] - c.q_lens[b];
      (step ? slots_step : slots_past).push_back(slot);
      (step ? qkv_step : qkv_past).insert((step ? qkv_step : qkv_past).end(), row, row + width);
    }
  }

  // CPU reference: attention over the full sequences, rows of this step.
  const AttentionShape shape{c.H, c.KV, c.D};
  std::vector<float> out_full(T_full * HD), lse_full(T_full * c.H);
  AttentionForward(View(out_full, {T_full, HD}), View(lse_full, {T_full, c.H}),
                   View(const_cast<std::vector<float>&>(qkv), {T_full, width}), View(cu, {B + 1}),
                   shape);
  PagedRun run;
  for (int64_t b = 0; b < B; ++b) {
    const int64_t first = cu[b] + c.lengths[b] - c.q_lens[b];
    run.reference.insert(run.reference.end(), out_full.begin() + first * HD,
                         out_full.begin() + cu[b + 1] * HD);
  }

  DeviceTensor k_cache(dt, {num_blocks, c.KV, bs, c.D}), v_cache(dt, {num_blocks, c.KV, bs, c.D});
  const int64_t T_past = T_full - T;
  DeviceTensor d_past(dt, {std::max<int64_t>(T_past, 1), width});
  DeviceTensor d_slots_past(DType::kI32, {std::max<int64_t>(T_past, 1)});
  DeviceTensor d_step(dt, {T, width}), d_slots_step(DType::kI32, {T});
  DeviceTensor d_tables(DType::kI32, {B, max_blocks}), d_q_start(DType::kI32, {B + 1});
  DeviceTensor d_context(DType::kI32, {B}), d_out(dt, {T, HD});
  if (T_past > 0) {
    d_past.Upload(qkv_past);
    d_slots_past.Upload(slots_past);
    KvCacheWrite(k_cache.t, v_cache.t, d_past.t, d_slots_past.t, shape);
  }
  d_step.Upload(qkv_step);
  d_slots_step.Upload(slots_step);
  d_tables.Upload(tables);
  d_q_start.Upload(q_start);
  d_context.Upload(context);
  KvCacheWrite(k_cache.t, v_cache.t, d_step.t, d_slots_step.t, shape);
  PagedAttentionForward(d_out.t, d_step.t, k_cache.t, v_cache.t, d_tables.t, d_q_start.t,
                        d_context.t, shape, ReductionOrder::kFast);
  run.paged_fast = d_out.Download();
  testing::Poison(d_out.t);
  PagedAttentionForward(d_out.t, d_step.t, k_cache.t, v_cache.t, d_tables.t, d_q_start.t,
                        d_context.t, shape, ReductionOrder::kBatchInvariant);
  run.paged_invariant = d_out.Download();

  // The learner's packed batch-invariant attention of the full sequences.
  DeviceTensor d_full(dt, {T_full, width}), d_cu(DType::kI32, {B + 1});
  DeviceTensor d_full_out(dt, {T_full, HD}), d_lse(DType::kF32, {T_full, c.H});
  d_full.Upload(qkv);
  d_cu.Upload(cu);
  AttentionForward(d_full_out.t, d_lse.t, d_full.t, d_cu.t, shape, ReductionOrder::kBatchInvariant);
  const std::vector<float> full = d_full_out.Download();
  run.packed_all = full;
  run.reference_all = out_full;
  run.packed_lse = d_lse.Download();
  run.reference_lse = lse_full;
  for (int64_t b = 0; b < B; ++b) {
    const int64_t first = cu[b] + c.lengths[b] - c.q_lens[b];
    run.packed_invariant.insert(run.packed_invariant.end(), full.begin() + first * HD,
                                full.begin() + cu[b + 1] * HD);
  }
  return run;
}

const PagedCase kCases[] = {
    // decode rows at short and long contexts, a prefill chunk over cached context, a whole
    // prompt; GQA 7:1 as Qwen2.5-0.5B, MHA, MQA.
    {{1, 17, 100, 700, 40}, {1, 1, 1, 1, 40}, 14, 2, 64, 16},
    {{33, 260, 5}, {20, 1, 5}, 4, 4, 128, 16},
    {{64, 1000}, {1, 70}, 8, 1, 64, 32},
    {{9, 300}, {1, 1}, 6, 2, 16, 8},
    // head_dim 256 (8 values per lane); blocks of 12 and 48 positions, which do not divide
    // the 32-key chunks.
    {{50, 200}, {1, 9}, 2, 1, 256, 12},
    {{97, 5, 130}, {1, 5, 30}, 8, 2, 64, 48},
};

TEST(CudaPagedAttentionTest, MatchesFullSequenceAttentionOnTheCpu) {
  PRL_SKIP_WITHOUT_GPU();
  for (DType dt : {DType::kF32, DType::kBF16}) {
    for (const PagedCase& c : kCases) {
      const PagedRun run = RunPaged(c, dt, 7);
      SCOPED_TRACE(::testing::Message()
                   << DTypeName(dt) << " H" << c.H << " KV" << c.KV << " D" << c.D);
      EXPECT_LE(RelativeError(run.paged_fast, run.reference), testing::Tolerance(dt));
      EXPECT_LE(RelativeError(run.paged_invariant, run.reference), testing::Tolerance(dt));
      // The learner's invariant attention: every row, and the lse its backward reads (fp32
      // scores of the same stored inputs: fp32 agreement in both modes).
      EXPECT_LE(RelativeError(run.packed_all, run.reference_all), testing::Tolerance(dt));
      EXPECT_LE(RelativeError(run.packed_lse, run.reference_lse), testing::kF32Tolerance);
    }
  }
}

// KV writes skip negative slots (the padding rows of a CUDA-graph bucket) and touch nothing
// else; block copies move whole blocks of both caches.
TEST(CudaPagedAttentionTest, KvWritesSkipNegativeSlotsAndBlockCopiesMoveWholeBlocks) {
  PRL_SKIP_WITHOUT_GPU();
  const int64_t H = 4, KV = 2, D = 32, bs = 16, num_blocks = 6, width = (H + 2 * KV) * D;
  const AttentionShape shape{H, KV, D};
  for (DType dt : {DType::kF32, DType::kBF16}) {
    const std::vector<float> qkv = AsStored(Random(3 * width, 21), dt);
    DeviceTensor k_cache(dt, {num_blocks, KV, bs, D}), v_cache(dt, {num_blocks, KV, bs, D});
    DeviceTensor d_qkv(dt, {3, width}), d_slots(DType::kI32, {3});
    d_qkv.Upload(qkv);
    d_slots.Upload(std::vector<int32_t>{5, -1, 2 * bs + 7});  // block 0 slot 5, skip, block 2
    KvCacheWrite(k_cache.t, v_cache.t, d_qkv.t, d_slots.t, shape);
    std::vector<float> k = k_cache.Download(), v = v_cache.Download();
    auto at = [&](int64_t block, int64_t g, int64_t offset, int64_t d) {
      return ((block * KV + g) * bs + offset) * D + d;
    };
    int64_t written = 0;
    for (int64_t i = 0; i < static_cast<int64_t>(k.size()); ++i) written += !std::isnan(k[i]);
    EXPECT_EQ(written, 2 * KV * D) << "exactly two rows written";
    for (int64_t g = 0; g < KV; ++g) {
      for (int64_t d = 0; d < D; ++d) {
        EXPECT_EQ(k[at(0, g, 5, d)], qkv[(H + g) * D + d]);
        EXPECT_EQ(v[at(0, g, 5, d)], qkv[(H + KV + g) * D + d]);
        EXPECT_EQ(k[at(2, g, 7, d)], qkv[2 * width + (H + g) * D + d]);
        EXPECT_EQ(v[at(2, g, 7, d)], qkv[2 * width + (H + KV + g) * D + d]);
      }
    }
    // Blocks 0 -> 4 and 2 -> 1, in one call.
    DeviceTensor pairs(DType::kI32, {2, 2});
    pairs.Upload(std::vector<int32_t>{0, 4, 2, 1});
    KvCacheCopyBlocks(k_cache.t, v_cache.t, pairs.t);
    const std::vector<float> k2 = k_cache.Download(), v2 = v_cache.Download();
    const int64_t block = KV * bs * D;
    for (auto [src, dst] : {std::pair<int64_t, int64_t>{0, 4}, {2, 1}}) {
      EXPECT_EQ(std::memcmp(&k2[dst * block], &k[src * block], block * sizeof(float)), 0);
      EXPECT_EQ(std::memcmp(&v2[dst * block], &v[src * block], block * sizeof(float)), 0);
    }
    EXPECT_EQ(std::memcmp(&k2[3 * block], &k[3 * block], block * sizeof(float)), 0);
  }
}

TEST(CudaPagedAttentionTest, BatchInvariantOrderEqualsThePackedLearnerAttentionBitForBit) {
  PRL_SKIP_WITHOUT_GPU();
  for (DType dt : {DType::kF32, DType::kBF16}) {
    for (const PagedCase& c : kCases) {
      const PagedRun run = RunPaged(c, dt, 11);
      EXPECT_TRUE(BitEqual(run.paged_invariant, run.packed_invariant))
          << DTypeName(dt) << " H" << c.H << " D" << c.D;
    }
  }
}

TEST(CudaInvariantGemmTest, ARowHasTheSameBitsInEveryBatchAndMatchesTheCpu) {
  PRL_SKIP_WITHOUT_GPU();
  // K over several 256-chunks, N across tiles. 1100 rows make 18 x 16 = 288 tiles, more than
  // two per SM on an H100 (132 SMs): the unsplit path; the smaller batches split over K.
  const int64_t K = 896, N = 1000, M_max = 1100;
  for (DType dt : {DType::kF32, DType::kBF16}) {
    const std::vector<float> a = AsStored(Random(M_max * K, 1), dt);
    const std::vector<float> w = AsStored(Random(N * K, 2), dt);
    const std::vector<float> bias = AsStored(Random(N, 3), dt);
    std::vector<float> want(M_max * N);
    MatmulForward(View(want, {M_max, N}), View(const_cast<std::vector<float>&>(a), {M_max, K}),
                  View(const_cast<std::vector<float>&>(w), {N, K}),
                  View(const_cast<std::vector<float>&>(bias), {N}));
    DeviceTensor dw(dt, {N, K}), db(dt, {N});
    dw.Upload(w);
    db.Upload(bias);
    std::vector<std::vector<float>> by_m;
    for (int64_t M : {int64_t{1}, int64_t{3}, int64_t{16}, int64_t{17}, int64_t{300},
                      M_max}) {  // both tile shapes, split and unsplit
      DeviceTensor da(dt, {M, K}), dout(DType::kF32, {M, N});
      da.Upload(std::vector<float>(a.begin(), a.begin() + M * K));
      MatmulForward(dout.t, da.t, dw.t, db.t, false, ReductionOrder::kBatchInvariant);
      by_m.push_back(dout.Download());
    }
    // Every row of every batch has the bits of the same row in the largest batch.
    for (const auto& got : by_m) {
      EXPECT_TRUE(
          BitEqual(got, std::vector<float>(by_m.back().begin(), by_m.back().begin() + got.size())))
          << DTypeName(dt) << ": a batch of " << got.size() / N << " rows differs";
    }
    EXPECT_LE(RelativeError(by_m.back(), want), testing::kF32Tolerance) << DTypeName(dt);
  }
}

TEST(CudaInvariantLogprobTest, ARowsLogprobDoesNotDependOnTheBatch) {
  PRL_SKIP_WITHOUT_GPU();
  // C over three 256-chunks of the invariant GEMM; chunks of 40 rows use its 64-row tiles, a
  // row alone its 16-row tiles.
  const int64_t C = 640, V = 5000, R = 40;
  for (DType dt : {DType::kF32, DType::kBF16}) {
    const std::vector<float> h = AsStored(Random(R * C, 4), dt),
                             W = AsStored(Random(V * C, 5, 0.1f), dt);
    std::vector<int32_t> targets(R);
    for (int64_t r = 0; r < R; ++r) targets[r] = static_cast<int32_t>((r * 977) % V);
    DeviceTensor dW(dt, {V, C});
    dW.Upload(W);
    std::vector<float> alone;
    for (int64_t r = 0; r < R; r += 13) {
      DeviceTensor dh(dt, {1, C}), dt_(DType::kI32, {1}), lp(DType::kF32, {1}),
          lse(DType::kF32, {1});
      DeviceTensor scratch(DType::kF32, {1, V});
      dh.Upload(std::vector<float>(h.begin() + r * C, h.begin() + (r + 1) * C));
      dt_.Upload(std::vector<int32_t>{targets[r]});
      LogprobForward(lp.t, lse.t, dh.t, dW.t, dt_.t, 0.8f, scratch.t,
                     ReductionOrder::kBatchInvariant);
      alone.push_back(lp.Download()[0]);
    }
    DeviceTensor dh(dt, {R, C}), dtg(DType::kI32, {R}), lp(DType::kF32, {R}), lse(DType::kF32, {R});
    DeviceTensor scratch(DType::kF32, {R, V});  // one chunk of all rows
    dh.Upload(h);
    dtg.Upload(targets);
    LogprobForward(lp.t, lse.t, dh.t, dW.t, dtg.t, 0.8f, scratch.t,
                   ReductionOrder::kBatchInvariant);
    const std::vector<float> batch = lp.Download();
    for (int64_t r = 0, i = 0; r < R; r += 13, ++i) {
      EXPECT_EQ(std::memcmp(&batch[r], &alone[i], sizeof(float)), 0)
          << DTypeName(dt) << " row " << r << ": " << batch[r] << " vs " << alone[i];
    }
  }
}
#endif  // PRL_WITH_CUDA

}  // namespace
}  // namespace prl::kernels
