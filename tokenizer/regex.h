// A compiled PCRE2 regular expression (UTF + Unicode properties, JIT when available) for the
// tokenizer's Split pre-tokenizer and Replace normalizer/decoder. Hugging Face patterns are
// written for Rust's regex / Oniguruma; PCRE2 accepts them unchanged (\p{L}, (?i:...), (?!..)).
//
// Thread-safety: immutable after Compile; Matches may run concurrently (match data and JIT
// stacks are per call / per thread).
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"
#include "tokenizer/json_path.h"

namespace prl::tokenizer {

class Regex {
 public:
  // `where` names the pattern in errors (e.g. "tokenizer.json: pre_tokenizer.pattern.Regex").
  static absl::StatusOr<Regex> Compile(absl::string_view pattern, absl::string_view where);
  // A pattern matching `literal` exactly.
  static absl::StatusOr<Regex> Literal(absl::string_view literal, absl::string_view where);

  // Calls fn(begin, end) (byte offsets) for every non-overlapping match in valid UTF-8 `text`,
  // left to right; after an empty match the search resumes one code point later.
  void ForEachMatch(absl::string_view text,
                    absl::FunctionRef<void(size_t begin, size_t end)> fn) const;

  // `text` with every match replaced by `replacement` (taken literally).
  std::string ReplaceAll(absl::string_view text, absl::string_view replacement) const;

 private:
  struct Code;
  explicit Regex(std::shared_ptr<const Code> code) : code_(std::move(code)) {}
  std::shared_ptr<const Code> code_;
};

// A tokenizer.json pattern object: {"String": literal} or {"Regex": pattern}.
absl::StatusOr<Regex> PatternFromJson(const nlohmann::json& pattern, const JsonPath& path);

}  // namespace prl::tokenizer
