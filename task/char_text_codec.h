// The TextCodec (tokenizer/text_codec.h) of the built-in arithmetic task's character tokenizer:
// for the models `prl run` creates on the fly, which have no tokenizer files. Prompts get a BOS
// (as the task's own prompts do); completions decode up to EOS; the stop id is EOS. There is no
// chat template.
#pragma once

#include "task/char_tokenizer.h"
#include "tokenizer/text_codec.h"

namespace prl::task {

class CharTextCodec final : public tokenizer::TextCodec {
 public:
  absl::StatusOr<std::vector<int32_t>> EncodePrompt(absl::string_view text) const override;
  absl::StatusOr<std::vector<int32_t>> EncodeContinuation(absl::string_view text) const override {
    return tokenizer_.Encode(text);
  }
  absl::StatusOr<std::string> RenderChat(const tokenizer::ChatPrompt& chat) const override;
  absl::StatusOr<std::vector<int32_t>> EncodeChat(const tokenizer::ChatPrompt& chat) const override;
  absl::StatusOr<std::string> DecodeCompletion(absl::Span<const int32_t> ids) const override;
  std::vector<int32_t> stop_ids() const override { return {tokenizer_.eos_id()}; }
  int32_t vocab_size() const override { return tokenizer_.vocab_size(); }
  std::string Describe() const override;

 private:
  CharTokenizer tokenizer_;
};

}  // namespace prl::task
