#include "inference_engine/block_manager.h"

#include <algorithm>

#include "core/check.h"

namespace prl {

BlockManager::BlockManager(int32_t num_blocks, int32_t block_size, bool prefix_caching)
    : block_size_(block_size),
      prefix_caching_(prefix_caching),
      ref_count_(num_blocks, 0),
      prev_(num_blocks, -1),
      next_(num_blocks, -1),
      in_free_queue_(num_blocks, false),
      hash_of_(num_blocks, 0),
      has_hash_(num_blocks, false),
      tokens_(prefix_caching ? static_cast<size_t>(num_blocks) * block_size : 0) {
  PRL_CHECK(num_blocks > 0 && block_size > 0, "BlockManager needs blocks");
  for (int32_t b = 0; b < num_blocks; ++b) PushBack(b);
}

void BlockManager::Unlink(int32_t b) {
  if (prev_[b] >= 0)
    next_[prev_[b]] = next_[b];
  else
    head_ = next_[b];
  if (next_[b] >= 0)
    prev_[next_[b]] = prev_[b];
  else
    tail_ = prev_[b];
  prev_[b] = next_[b] = -1;
  in_free_queue_[b] = false;
  --num_free_;
}

void BlockManager::PushBack(int32_t b) {
  prev_[b] = tail_;
  next_[b] = -1;
  if (tail_ >= 0)
    next_[tail_] = b;
  else
    head_ = b;
  tail_ = b;
  in_free_queue_[b] = true;
  ++num_free_;
}

void BlockManager::Forget(int32_t b) {
  if (!has_hash_[b]) return;
  auto it = by_hash_.find(hash_of_[b]);
  if (it != by_hash_.end() && it->second == b) by_hash_.erase(it);
  has_hash_[b] = false;
}

int32_t BlockManager::Allocate() {
  if (head_ < 0) return -1;
  const int32_t b = head_;
  Unlink(b);
  Forget(b);
  ref_count_[b] = 1;
  return b;
}

void BlockManager::Retain(int32_t b) {
  if (ref_count_[b] == 0) {
    PRL_CHECK(in_free_queue_[b], "block ", b, " has no references and is not free");
    Unlink(b);
  }
  ++ref_count_[b];
}

void BlockManager::Release(int32_t b) {
  PRL_CHECK(ref_count_[b] > 0, "block ", b, " released more often than retained");
  if (--ref_count_[b] == 0) PushBack(b);
}

uint64_t BlockManager::HashBlock(uint64_t parent_hash, absl::Span<const int32_t> tokens) {
  // FNV-1a over the parent hash and the tokens, finished with a SplitMix64 mix.
  uint64_t h = 0xcbf29ce484222325ull ^ parent_hash;
  for (int32_t t : tokens) {
    h ^= static_cast<uint32_t>(t);
    h *= 0x100000001b3ull;
  }
  h ^= h >> 30;
  h *= 0xbf58476d1ce4e5b9ull;
  h ^= h >> 27;
  h *= 0x94d049bb133111ebull;
  return h ^ (h >> 31);
}

int32_t BlockManager::Lookup(uint64_t hash, absl::Span<const int32_t> tokens) const {
  if (!prefix_caching_) return -1;
  auto it = by_hash_.find(hash);
  if (it == by_hash_.end()) return -1;
  const int32_t b = it->second;
  const int32_t* cached = tokens_.data() + static_cast<size_t>(b) * block_size_;
  return std::equal(tokens.begin(), tokens.end(), cached) ? b : -1;
}

void BlockManager::Register(int32_t b, uint64_t hash, absl::Span<const int32_t> tokens) {
  if (!prefix_caching_ || has_hash_[b]) return;
  PRL_CHECK(static_cast<int32_t>(tokens.size()) == block_size_, "only full blocks are cached");
  if (by_hash_.count(hash)) return;  // another block already caches this prefix
  by_hash_[hash] = b;
  hash_of_[b] = hash;
  has_hash_[b] = true;
  std::copy(tokens.begin(), tokens.end(), tokens_.begin() + static_cast<size_t>(b) * block_size_);
}

void BlockManager::ClearPrefixCache() {
  by_hash_.clear();
  std::fill(has_hash_.begin(), has_hash_.end(), false);
}

}  // namespace prl
