// StopStrings: whether a model turn's newest token completes one of its episode's stop strings
// (StartEpisodeResponse.stop_strings, e.g. "</call>"), anywhere in the turn's text, as vLLM
// stops on a string: the turn ends at the token that completes it, even when that token also
// carries more text ("</call>" and "\n" merged into one BPE token; "jquery" for a stop "q"). The
// turn keeps every token it sampled (its text may run on past the stop string within that
// last token).
//
// Only the turn's tail is decoded: tokens from the end until the text before the newest token
// holds at least the longest stop string (up to 64 bytes however few bytes a token decodes
// to), so a stop string that the newest token completes lies wholly inside the window.
//
// Thread-safety: immutable; CompletedBy may be called from any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/types/span.h"
#include "tokenizer/text_codec.h"

namespace prl::episode {

class StopStrings {
 public:
  StopStrings(std::shared_ptr<const tokenizer::TextCodec> codec, std::vector<std::string> stops);

  // `turn`: the turn's tokens so far, the newest last. True when the newest token completes a
  // stop string (it is in the decoded text with the newest token and not in the text without).
  bool CompletedBy(absl::Span<const int32_t> turn) const;

 private:
  std::shared_ptr<const tokenizer::TextCodec> codec_;
  std::vector<std::string> stops_;
  size_t longest_ = 0;  // bytes
};

}  // namespace prl::episode
