// BlockManager: bookkeeping of the paged KV cache's blocks (vLLM's block manager).
//
// Every block is either referenced (ref_count > 0: in the block tables of that many sequences)
// or free. Free blocks sit in one LRU queue; a free block may still hold a cached prefix
// (prefix caching), which it loses when the queue hands it out again. Sharing is by reference
// count: a group's samples share their prompt's blocks, and sequences with a common prefix share
// the full blocks a hash lookup finds. A shared block is never written: the scheduler copies it
// first (copy-on-write).
//
// Invariant: num_free_blocks() + #referenced blocks == num_blocks(). Not thread-safe (owned by
// the engine's single scheduling thread).
#pragma once

#include <cstdint>
#include <unordered_map>
#include <vector>

#include "absl/types/span.h"

namespace prl {

class BlockManager {
 public:
  BlockManager(int32_t num_blocks, int32_t block_size, bool prefix_caching);

  int32_t num_blocks() const { return static_cast<int32_t>(ref_count_.size()); }
  int32_t block_size() const { return block_size_; }
  int32_t num_free_blocks() const { return num_free_; }
  int32_t ref_count(int32_t block) const { return ref_count_[block]; }
  bool prefix_caching() const { return prefix_caching_; }

  // Takes the least recently freed block (dropping any prefix it cached) with ref_count 1;
  // -1 when none is free.
  int32_t Allocate();
  // One more sequence holds `block` (a free block with a cached prefix is revived).
  void Retain(int32_t block);
  // One sequence lets go of `block`; at zero it joins the free queue, keeping its prefix.
  void Release(int32_t block);

  // Prefix caching. A block's hash chains its tokens onto its predecessor's hash, so equal
  // hashes mean equal whole prefixes; tokens are compared too, so a collision is a miss.
  static uint64_t HashBlock(uint64_t parent_hash, absl::Span<const int32_t> tokens);
  // The block caching this full prefix block, or -1.
  int32_t Lookup(uint64_t hash, absl::Span<const int32_t> tokens) const;
  // Records that `block` (full, referenced) holds the prefix with this hash.
  void Register(int32_t block, uint64_t hash, absl::Span<const int32_t> tokens);
  // Forgets every cached prefix (the weights changed: cached K/V are stale).
  void ClearPrefixCache();
  int64_t prefix_cache_size() const { return static_cast<int64_t>(by_hash_.size()); }

 private:
  void Unlink(int32_t block);
  void PushBack(int32_t block);
  void Forget(int32_t block);

  int32_t block_size_;
  bool prefix_caching_;
  std::vector<int32_t> ref_count_;
  // Free queue as an intrusive doubly linked list over block ids (-1 terminated).
  std::vector<int32_t> prev_, next_;
  std::vector<bool> in_free_queue_;
  int32_t head_ = -1, tail_ = -1, num_free_ = 0;
  // Prefix cache: hash -> block, and per block its hash and tokens (for verification).
  std::unordered_map<uint64_t, int32_t> by_hash_;
  std::vector<uint64_t> hash_of_;
  std::vector<bool> has_hash_;
  std::vector<int32_t> tokens_;  // (num_blocks, block_size)
};

}  // namespace prl
