#include "task/char_text_codec.h"

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"

namespace prl::task {

absl::StatusOr<std::vector<int32_t>> CharTextCodec::EncodePrompt(absl::string_view text) const {
  PRL_ASSIGN_OR_RETURN(std::vector<int32_t> ids, tokenizer_.Encode(text));
  ids.insert(ids.begin(), tokenizer_.bos_id());
  return ids;
}

absl::StatusOr<std::string> CharTextCodec::RenderChat(const tokenizer::ChatPrompt&) const {
  return absl::FailedPreconditionError(
      "the built-in character tokenizer has no chat template: send text or token prompts, or use "
      "a model directory with tokenizer files (prl model init --tokenizer DIR)");
}

absl::StatusOr<std::vector<int32_t>> CharTextCodec::EncodeChat(
    const tokenizer::ChatPrompt& chat) const {
  return RenderChat(chat).status();
}

absl::StatusOr<std::string> CharTextCodec::DecodeCompletion(absl::Span<const int32_t> ids) const {
  return tokenizer_.Decode(ids);
}

std::string CharTextCodec::Describe() const {
  return absl::StrCat("the built-in character tokenizer (", tokenizer_.vocab_size(), " tokens)");
}

}  // namespace prl::task
