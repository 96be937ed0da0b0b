#include "inference_engine/block_manager.h"

#include <gtest/gtest.h>

#include <vector>

namespace prl {
namespace {

TEST(BlockManagerTest, AllocatesUntilEmptyAndReusesReleasedBlocksInLruOrder) {
  BlockManager bm(3, 4, /*prefix_caching=*/false);
  const int32_t a = bm.Allocate(), b = bm.Allocate(), c = bm.Allocate();
  EXPECT_EQ(bm.num_free_blocks(), 0);
  EXPECT_EQ(bm.Allocate(), -1);
  bm.Release(b);
  bm.Release(a);
  EXPECT_EQ(bm.num_free_blocks(), 2);
  EXPECT_EQ(bm.Allocate(), b) << "least recently freed first";
  EXPECT_EQ(bm.Allocate(), a);
  bm.Release(c);
  EXPECT_EQ(bm.num_free_blocks(), 1);
}

TEST(BlockManagerTest, SharedBlocksAreFreedWhenTheLastHolderReleases) {
  BlockManager bm(2, 4, false);
  const int32_t a = bm.Allocate();
  bm.Retain(a);
  bm.Retain(a);
  EXPECT_EQ(bm.ref_count(a), 3);
  bm.Release(a);
  bm.Release(a);
  EXPECT_EQ(bm.num_free_blocks(), 1);
  bm.Release(a);
  EXPECT_EQ(bm.num_free_blocks(), 2);
}

TEST(BlockManagerTest, PrefixCacheFindsFreedBlocksUntilTheyAreReallocated) {
  BlockManager bm(2, 2, /*prefix_caching=*/true);
  const std::vector<int32_t> tokens = {7, 9};
  const uint64_t h = BlockManager::HashBlock(0, tokens);
  const int32_t a = bm.Allocate();
  bm.Register(a, h, tokens);
  EXPECT_EQ(bm.Lookup(h, tokens), a);
  EXPECT_EQ(bm.Lookup(h, std::vector<int32_t>{7, 8}), -1) << "tokens are verified";
  bm.Release(a);  // free, but still caching
  EXPECT_EQ(bm.Lookup(h, tokens), a);
  bm.Retain(a);  // revived from the free queue
  EXPECT_EQ(bm.num_free_blocks(), 1);
  EXPECT_EQ(bm.ref_count(a), 1);
  bm.Release(a);
  const int32_t other = bm.Allocate();  // the never-used block comes first (LRU)
  EXPECT_NE(other, a);
  EXPECT_EQ(bm.Lookup(h, tokens), a);
  EXPECT_EQ(bm.Allocate(), a);  // now it is handed out and its prefix forgotten
  EXPECT_EQ(bm.Lookup(h, tokens), -1);
}

TEST(BlockManagerTest, ClearingThePrefixCacheForgetsEveryPrefix) {
  BlockManager bm(2, 1, true);
  const int32_t a = bm.Allocate();
  const std::vector<int32_t> t = {3};
  bm.Register(a, BlockManager::HashBlock(0, t), t);
  bm.ClearPrefixCache();
  EXPECT_EQ(bm.Lookup(BlockManager::HashBlock(0, t), t), -1);
  EXPECT_EQ(bm.prefix_cache_size(), 0);
}

TEST(BlockManagerTest, HashesChainThePrefix) {
  const std::vector<int32_t> x = {1, 2}, y = {3, 4};
  EXPECT_NE(BlockManager::HashBlock(BlockManager::HashBlock(0, x), y),
            BlockManager::HashBlock(BlockManager::HashBlock(0, y), y));
  EXPECT_EQ(BlockManager::HashBlock(5, x), BlockManager::HashBlock(5, x));
}

}  // namespace
}  // namespace prl
