#include "task/char_tokenizer.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace prl::task {

namespace {
// The characters of ids kNumSpecial.. in order; the header's id table is this string.
constexpr char kChars[] = "0123456789+-*=() #\n";

std::string DescribeChar(unsigned char c) {
  if (c == '\n') return "'\\n'";
  if (c >= 0x20 && c < 0x7f) return absl::StrCat("'", std::string(1, static_cast<char>(c)), "'");
  return absl::StrFormat("'\\x%02x'", c);
}
}  // namespace

CharTokenizer::CharTokenizer() {
  static_assert(sizeof(kChars) - 1 + kNumSpecial == kVocabSize);
  std::fill(std::begin(char_to_id_), std::end(char_to_id_), -1);
  for (int32_t i = 0; kChars[i] != '\0'; ++i) {
    char_to_id_[static_cast<unsigned char>(kChars[i])] = kNumSpecial + i;
  }
}

absl::StatusOr<std::vector<int32_t>> CharTokenizer::Encode(absl::string_view text) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    const int32_t id = char_to_id_[c];
    if (id < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "character ", DescribeChar(c), " at position ", i,
          " is not in the arithmetic task's vocabulary (digits, + - * = ( ), space, #, newline)"));
    }
    ids.push_back(id);
  }
  return ids;
}

absl::StatusOr<std::string> CharTokenizer::Decode(absl::Span<const int32_t> ids) const {
  std::string text;
  text.reserve(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    const int32_t id = ids[i];
    if (id < 0 || id >= kVocabSize) {
      return absl::InvalidArgumentError(absl::StrCat(
          "token id ", id, " at position ", i, " is outside the vocabulary [0, ", kVocabSize, ")"));
    }
    if (id == kEos) break;
    if (id < kNumSpecial) continue;  // BOS, PAD
    text.push_back(kChars[id - kNumSpecial]);
  }
  return text;
}

}  // namespace prl::task
