// The `pre_tokenizer` of tokenizer.json: splits normalised text into the words that the BPE
// model encodes one by one. Supported:
//   Split      a Regex/String pattern with behavior Isolated or Removed (invert honoured)
//   ByteLevel  GPT-2's byte-to-unicode mapping (add_prefix_space, use_regex with GPT-2's pattern)
//   Metaspace  ' ' -> replacement, prepend_scheme always/first/never, split on the replacement
//   Sequence   of these (flattened)
// Anything else is an error naming its JSON path.
//
// Thread-safety: immutable after FromJson; PreTokenize may run concurrently.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"
#include "tokenizer/json_path.h"
#include "tokenizer/regex.h"

namespace prl::tokenizer {

// GPT-2's byte-to-unicode table: printable Latin-1 bytes map to themselves, the others to
// U+0100 onwards, so every byte is a visible character.
char32_t ByteToUnicode(unsigned char byte);
// The inverse, or -1 for a code point that no byte maps to.
int UnicodeToByte(char32_t cp);

class PreTokenizer {
 public:
  // `config` is tokenizer.json's "pre_tokenizer" (null: the whole text is one word).
  static absl::StatusOr<PreTokenizer> FromJson(const nlohmann::json& config, const JsonPath& path);

  // Appends the words of `text` to *words. `first_section`: `text` starts the input (for
  // Metaspace's prepend_scheme "first").
  void PreTokenize(absl::string_view text, bool first_section,
                   std::vector<std::string>* words) const;

  // Whether a ByteLevel step maps the words' bytes to GPT-2's alphabet.
  bool byte_level() const { return byte_level_; }

 private:
  struct Step {
    enum class Kind { kSplit, kByteLevel, kMetaspace } kind;
    std::vector<Regex> pattern;     // kSplit; kByteLevel with use_regex: exactly one
    bool removed = false;           // kSplit: behavior Removed (else Isolated)
    bool invert = false;            // kSplit
    bool add_prefix_space = false;  // kByteLevel
    std::string replacement;        // kMetaspace
    enum class Prepend { kAlways, kFirst, kNever } prepend = Prepend::kAlways;  // kMetaspace
    bool split = true;                                                          // kMetaspace
  };
  static absl::Status Append(const nlohmann::json& config, const JsonPath& path,
                             std::vector<Step>* steps);
  static absl::Status AppendMetaspace(const nlohmann::json& config, const JsonPath& path,
                                      std::vector<Step>* steps);
  static void Apply(const Step& step, bool first_section, const std::string& word,
                    std::vector<std::string>* out);

  std::vector<Step> steps_;
  bool byte_level_ = false;
};

}  // namespace prl::tokenizer
