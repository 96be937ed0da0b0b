// The `model` of tokenizer.json when its type is "BPE": a vocabulary (token -> id) and merges
// ranked by their position in the merges list. Encode applies the lowest-ranked applicable
// merge first (ties: leftmost), with a linked list of symbols and a priority queue, as
// Hugging Face tokenizers does. Words shorter than kMaxCachedWordBytes are cached.
//
// Options honoured: unk_token, fuse_unk, byte_fallback (<0xXX> tokens), ignore_merges (a word
// that is itself in the vocabulary is one token). dropout (other than null/0),
// continuing_subword_prefix and end_of_word_suffix (other than null/"") are errors.
//
// Invariants: every merge's parts and result are in the vocabulary; ids are unique.
// Thread-safety: immutable after FromJson except the cache, which is sharded behind mutexes;
// Encode may run concurrently.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "nlohmann/json.hpp"
#include "tokenizer/json_path.h"

namespace prl::tokenizer {

class BpeModel {
 public:
  static constexpr size_t kMaxCachedWordBytes = 256;
  static constexpr size_t kCacheCapacityPerShard = 4096;

  static absl::StatusOr<std::unique_ptr<BpeModel>> FromJson(const nlohmann::json& config,
                                                            const JsonPath& path);

  // Appends the ids of `word` (valid UTF-8, non-empty). An unknown character without byte
  // fallback becomes unk_token; with no unk_token that is an InvalidArgument error.
  absl::Status Encode(absl::string_view word, std::vector<int32_t>* ids) const;

  // The vocabulary's id of `token`, or -1.
  int32_t TokenToId(absl::string_view token) const;
  // The token of `id`, or nullptr when the vocabulary has none.
  const std::string* IdToToken(int32_t id) const;
  // One past the largest id in the vocabulary.
  int32_t vocab_size() const { return static_cast<int32_t>(id_to_token_.size()); }

 private:
  struct Merge {
    int32_t rank;
    int32_t result;
  };
  struct CacheShard {
    absl::Mutex mu;
    absl::flat_hash_map<std::string, std::vector<int32_t>> words ABSL_GUARDED_BY(mu);
  };

  BpeModel() = default;
  absl::Status LoadVocab(const nlohmann::json& config, const JsonPath& path);
  absl::Status LoadMerges(const nlohmann::json& config, const JsonPath& path);
  // The initial symbols of `word`: one per character, or byte-fallback / unk tokens.
  absl::Status InitialSymbols(absl::string_view word, std::vector<int32_t>* symbols) const;
  void ApplyMerges(std::vector<int32_t>* symbols) const;
  static uint64_t PairKey(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }

  absl::flat_hash_map<std::string, int32_t> token_to_id_;
  std::vector<std::string> id_to_token_;  // "" where an id is unused
  std::vector<bool> id_used_;
  absl::flat_hash_map<char32_t, int32_t> char_to_id_;  // single-character tokens
  absl::flat_hash_map<uint64_t, Merge> merges_;        // PairKey(left, right) -> merge
  std::array<int32_t, 256> byte_ids_;                  // byte fallback ids, -1 if absent
  int32_t unk_id_ = -1;
  bool fuse_unk_ = false, byte_fallback_ = false, ignore_merges_ = false;
  mutable std::array<CacheShard, 16> cache_;
};

}  // namespace prl::tokenizer
