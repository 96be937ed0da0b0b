// Paged KV cache kernels: written slots, block copies, and paged attention against the packed
// attention of the same sequences, for several block sizes and prefill chunkings.
#include "kernels/paged_attention.h"

#include <gtest/gtest.h>

#include <cstring>
#include <numeric>

#include "tests/kernels/reference_ops.h"
#include "tests/kernels/tensor_util.h"

namespace prl::testing {
namespace {

using kernels::ReductionOrder;

constexpr int64_t H = 4, KV = 2, D = 8, W = (H + 2 * KV) * D;

struct Cache {
  int64_t block_size, num_blocks;
  std::vector<float> k, v;
  Cache(int64_t bs, int64_t blocks)
      : block_size(bs), num_blocks(blocks), k(blocks * KV * bs * D, NAN), v(k.size(), NAN) {}
  Tensor K() { return View(k, {num_blocks, KV, D, block_size}); }
  Tensor V() { return View(v, {num_blocks, KV, block_size, D}); }
};

// Runs a sequence of length `len` through the cache in chunks (the last chunks of size 1 are
// decode steps) and returns the attention output of every row.
std::vector<float> RunPaged(const std::vector<float>& qkv, int64_t len, int64_t block_size,
                            const std::vector<int64_t>& chunks, ReductionOrder order) {
  Cache cache(block_size, 128);
  // A scrambled block table: physical blocks need not be in order.
  const int64_t blocks = (len + block_size - 1) / block_size;
  std::vector<int32_t> table(blocks);
  for (int64_t i = 0; i < blocks; ++i) table[i] = static_cast<int32_t>((i * 7 + 3) % 128);
  std::vector<float> out(len * H * D, NAN);
  int64_t done = 0;
  for (int64_t chunk : chunks) {
    std::vector<float> rows(qkv.begin() + done * W, qkv.begin() + (done + chunk) * W);
    std::vector<int32_t> slots(chunk);
    for (int64_t i = 0; i < chunk; ++i) {
      const int64_t pos = done + i;
      slots[i] = static_cast<int32_t>(table[pos / block_size] * block_size + pos % block_size);
    }
    kernels::KvCacheWrite(cache.K(), cache.V(), View(rows, {chunk, W}), View(slots, {chunk}),
                          {H, KV, D});
    std::vector<int32_t> q_start = {0, static_cast<int32_t>(chunk)};
    std::vector<int32_t> context = {static_cast<int32_t>(done + chunk)};
    std::vector<float> chunk_out(chunk * H * D);
    kernels::PagedAttentionForward(View(chunk_out, {chunk, H * D}), View(rows, {chunk, W}),
                                   cache.K(), cache.V(), View(table, {1, blocks}),
                                   View(q_start, {2}), View(context, {1}), {H, KV, D}, order);
    std::copy(chunk_out.begin(), chunk_out.end(), out.begin() + done * H * D);
    done += chunk;
  }
  return out;
}

class PagedAttentionTest : public ::testing::TestWithParam<int64_t> {};

TEST_P(PagedAttentionTest, ChunkedPagedAttentionMatchesPackedAttention) {
  const int64_t block_size = GetParam();
  constexpr int64_t len = 75;
  std::mt19937_64 rng(23);
  const Vec qkv64 = RandomVec(len * W, rng);
  std::vector<float> qkv = ToF32(qkv64);
  const Vec reference = AttentionRef(qkv64, {0, len}, H, KV, D);
  for (const std::vector<int64_t>& chunks :
       {std::vector<int64_t>{75}, std::vector<int64_t>{30, 40, 1, 1, 1, 1, 1},
        std::vector<int64_t>(75, 1)}) {
    const std::vector<float> fast = RunPaged(qkv, len, block_size, chunks, ReductionOrder::kFast);
    EXPECT_LT(RelativeError(ToF64(fast), reference), 1e-6) << chunks.size() << " chunks";
  }
}

TEST_P(PagedAttentionTest, InvariantPagedAttentionEqualsInvariantPackedAttentionBitwise) {
  const int64_t block_size = GetParam();
  constexpr int64_t len = 75;
  std::mt19937_64 rng(24);
  std::vector<float> qkv = ToF32(RandomVec(len * W, rng));
  std::vector<float> packed(len * H * D), lse(len * H);
  std::vector<int32_t> cu = {0, len};
  kernels::AttentionForward(View(packed, {len, H * D}), View(lse, {len, H}), View(qkv, {len, W}),
                            View(cu, {2}), {H, KV, D}, ReductionOrder::kBatchInvariant);
  for (const std::vector<int64_t>& chunks :
       {std::vector<int64_t>{75}, std::vector<int64_t>{16, 17, 40, 1, 1}}) {
    const std::vector<float> paged =
        RunPaged(qkv, len, block_size, chunks, ReductionOrder::kBatchInvariant);
    EXPECT_EQ(std::memcmp(paged.data(), packed.data(), packed.size() * sizeof(float)), 0)
        << chunks.size() << " chunks";
  }
}

INSTANTIATE_TEST_SUITE_P(BlockSizes, PagedAttentionTest, ::testing::Values(1, 16, 64));

TEST(KvCacheTest, WriteFillsSlotsAndCopyBlocksDuplicatesBlocks) {
  Cache cache(4, 3);
  std::vector<float> qkv(2 * W);
  std::iota(qkv.begin(), qkv.end(), 0.0f);
  std::vector<int32_t> slots = {5, -1};  // block 1, offset 1; second row skipped
  kernels::KvCacheWrite(cache.K(), cache.V(), View(qkv, {2, W}), View(slots, {2}), {H, KV, D});
  for (int64_t g = 0; g < KV; ++g) {
    for (int64_t d = 0; d < D; ++d) {
      EXPECT_EQ(cache.k[((1 * KV + g) * D + d) * 4 + 1], qkv[(H + g) * D + d]);
      EXPECT_EQ(cache.v[((1 * KV + g) * 4 + 1) * D + d], qkv[(H + KV + g) * D + d]);
    }
  }
  std::vector<int32_t> pairs = {1, 2};
  kernels::KvCacheCopyBlocks(cache.K(), cache.V(), View(pairs, {1, 2}));
  const int64_t block = KV * 4 * D;
  EXPECT_EQ(std::memcmp(cache.k.data() + 2 * block, cache.k.data() + block, block * 4), 0);
  EXPECT_EQ(std::memcmp(cache.v.data() + 2 * block, cache.v.data() + block, block * 4), 0);
}

}  // namespace
}  // namespace prl::testing
