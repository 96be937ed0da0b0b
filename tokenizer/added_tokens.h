// tokenizer.json's `added_tokens`: strings matched in the input before normalisation and
// pre-tokenisation and given their ids directly (special tokens such as <|im_start|> and
// ordinary ones such as <think>).
//
// Matching is leftmost-longest. Flags, as in Hugging Face tokenizers:
//   lstrip / rstrip   the match swallows the whitespace on its left / right
//   single_word       matches only where it is not inside a word (letters, digits, '_')
//   normalized        matched in the normalised text (the others in the raw input)
//   special           dropped by Decode(..., skip_special_tokens = true)
//
// Thread-safety: immutable after construction; Split may run concurrently.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"

namespace prl::tokenizer {

struct AddedToken {
  int32_t id = -1;
  std::string content;
  bool special = false, lstrip = false, rstrip = false, single_word = false, normalized = false;
};

// A piece of the input: an added token (id >= 0) or a stretch of text (id == -1).
struct Segment {
  size_t begin = 0, end = 0;  // byte offsets into the split text
  int32_t id = -1;
};

// One set of added tokens matched over one kind of text (raw or normalised).
class AddedTokenMatcher {
 public:
  AddedTokenMatcher() = default;
  explicit AddedTokenMatcher(std::vector<AddedToken> tokens);

  // `text` cut into text and token segments that cover it in order; empty text segments are
  // left out.
  std::vector<Segment> Split(absl::string_view text) const;
  bool empty() const { return tokens_.empty(); }

 private:
  struct Node {
    absl::flat_hash_map<unsigned char, int> children;
    int token = -1;  // index into tokens_ of the token ending here
  };
  // The longest token matching at text[pos] that is acceptable there, as an index into
  // tokens_, or -1.
  int LongestMatch(absl::string_view text, size_t pos) const;

  std::vector<AddedToken> tokens_;
  std::vector<Node> trie_;     // trie_[0] is the root
  bool first_byte_[256] = {};  // a token starts with this byte
};

}  // namespace prl::tokenizer
