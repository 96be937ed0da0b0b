// The `decoder` of tokenizer.json: turns the token strings of ids back into text. Supported:
//   ByteLevel     GPT-2 alphabet -> bytes -> UTF-8 (invalid sequences become U+FFFD)
//   Replace       a String/Regex pattern in each token
//   ByteFallback  runs of <0xXX> tokens -> their bytes as UTF-8 (invalid: one U+FFFD per byte)
//   Fuse          all tokens into one
//   Strip         up to `start` leading and `stop` trailing `content` characters of each token
//   Metaspace     replacement -> ' ', the first token's leading space removed unless
//                 prepend_scheme is "never"
//   Sequence      of these (flattened)
// With no decoder the tokens are joined with spaces (as tokenizers does). Anything else is an
// error naming its JSON path.
//
// Thread-safety: immutable after FromJson; Decode may run concurrently.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "tokenizer/json_path.h"
#include "tokenizer/regex.h"

namespace prl::tokenizer {

class Decoder {
 public:
  // `config` is tokenizer.json's "decoder" (may be null).
  static absl::StatusOr<Decoder> FromJson(const nlohmann::json& config, const JsonPath& path);

  // The text of `tokens` (token strings, in order).
  std::string Decode(std::vector<std::string> tokens) const;

 private:
  struct Step {
    enum class Kind { kByteLevel, kReplace, kByteFallback, kFuse, kStrip, kMetaspace } kind;
    std::vector<Regex> pattern;     // kReplace: exactly one
    std::string content;            // kReplace: replacement; kStrip: the character; kMetaspace:
                                    // the replacement character
    int start = 0, stop = 0;        // kStrip
    bool strip_first_space = true;  // kMetaspace
  };
  static absl::Status Append(const nlohmann::json& config, const JsonPath& path,
                             std::vector<Step>* steps);
  static void Apply(const Step& step, std::vector<std::string>* tokens);

  std::vector<Step> steps_;
  bool join_with_spaces_ = false;  // no decoder at all
};

}  // namespace prl::tokenizer
