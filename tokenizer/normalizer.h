// The `normalizer` of tokenizer.json: what happens to each stretch of text between added
// tokens before pre-tokenisation. Supported: NFC, NFD, NFKC, NFKD (utf8proc), Prepend,
// Replace (String or Regex pattern), Strip, and Sequence of these (flattened into one list of
// steps). Anything else is an error naming its JSON path.
//
// Thread-safety: immutable after FromJson; Normalize may run concurrently.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"
#include "tokenizer/json_path.h"
#include "tokenizer/regex.h"
#include "tokenizer/unicode.h"

namespace prl::tokenizer {

class Normalizer {
 public:
  // `config` is tokenizer.json's "normalizer" (null: the identity).
  static absl::StatusOr<Normalizer> FromJson(const nlohmann::json& config, const JsonPath& path);

  // `text` (valid UTF-8) after every step, in order.
  absl::StatusOr<std::string> Normalize(absl::string_view text) const;
  bool empty() const { return steps_.empty(); }

 private:
  struct Step {
    enum class Kind { kUnicode, kPrepend, kReplace, kStrip } kind;
    NormalForm form = NormalForm::kNFC;  // kUnicode
    std::string content;                 // kPrepend: the prefix; kReplace: the replacement
    std::vector<Regex> pattern;          // kReplace: exactly one
    bool strip_left = false, strip_right = false;  // kStrip
  };
  static absl::Status Append(const nlohmann::json& config, const JsonPath& path,
                             std::vector<Step>* steps);
  std::vector<Step> steps_;
};

}  // namespace prl::tokenizer
