// The character-level tokenizer of prl's built-in arithmetic task (task/arithmetic_task.h):
// one token per character of a fixed 22-symbol vocabulary, so that a model created on the fly
// needs no tokenizer files.
//
// Ids (fixed; a model trained with them depends on them):
//   0 PAD   1 BOS   2 EOS
//   3..12   '0'..'9'
//   13 '+'  14 '-'  15 '*'  16 '='  17 '('  18 ')'  19 ' '  20 '#'  21 '\n'
// vocab_size() = 22. Encode adds no special tokens; callers add BOS / EOS where they belong.
//
// Thread-safety: immutable after construction; every method may be called concurrently.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace prl::task {

class CharTokenizer {
 public:
  static constexpr int32_t kPad = 0;
  static constexpr int32_t kBos = 1;
  static constexpr int32_t kEos = 2;

  CharTokenizer();

  // One id per character. A character outside the vocabulary is an InvalidArgument error that
  // names it (printable or as \xNN) and its byte position.
  absl::StatusOr<std::vector<int32_t>> Encode(absl::string_view text) const;

  // The text of `ids` up to the first EOS (exclusive): what a verifier compares, since a
  // completion ends at EOS. BOS and PAD are skipped. An id outside [0, vocab_size()) is an
  // InvalidArgument error naming the id and its position. Decode(Encode(t)) == t.
  absl::StatusOr<std::string> Decode(absl::Span<const int32_t> ids) const;

  int32_t vocab_size() const { return kVocabSize; }
  int32_t pad_id() const { return kPad; }
  int32_t bos_id() const { return kBos; }
  int32_t eos_id() const { return kEos; }

 private:
  static constexpr int32_t kVocabSize = 22;
  static constexpr int32_t kNumSpecial = 3;

  int32_t char_to_id_[256];  // -1: not in the vocabulary
};

}  // namespace prl::task
