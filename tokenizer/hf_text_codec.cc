#include "tokenizer/hf_text_codec.h"

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"

namespace prl::tokenizer {

absl::StatusOr<std::unique_ptr<HfTextCodec>> HfTextCodec::Load(const std::string& model_dir) {
  if (!std::filesystem::exists(std::filesystem::path(model_dir) / "tokenizer.json")) {
    return absl::NotFoundError(absl::StrCat(model_dir, " has no tokenizer.json"));
  }
  PRL_ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tokenizer, Tokenizer::Load(model_dir));
  std::optional<ChatTemplate> chat_template;
  if (tokenizer->chat_template().has_value()) {
    absl::StatusOr<ChatTemplate> parsed = ChatTemplate::Parse(*tokenizer->chat_template());
    if (!parsed.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          model_dir, "/tokenizer_config.json: chat_template: ", parsed.status().message()));
    }
    chat_template = std::move(*parsed);
  }
  return std::unique_ptr<HfTextCodec>(
      new HfTextCodec(model_dir, std::move(tokenizer), std::move(chat_template)));
}

absl::StatusOr<std::vector<int32_t>> HfTextCodec::EncodePrompt(absl::string_view text) const {
  return tokenizer_->Encode(text, /*add_special_tokens=*/true);
}

absl::StatusOr<std::vector<int32_t>> HfTextCodec::EncodeContinuation(
    absl::string_view text) const {
  return tokenizer_->Encode(text, /*add_special_tokens=*/false);
}

absl::StatusOr<std::string> HfTextCodec::RenderChat(const ChatPrompt& chat) const {
  if (!chat_template_.has_value()) {
    return absl::FailedPreconditionError(absl::StrCat(
        model_dir_, "/tokenizer_config.json has no chat_template: send text or token prompts"));
  }
  ChatTemplateInputs inputs;
  inputs.messages = chat.messages;
  inputs.tools = chat.tools;
  inputs.add_generation_prompt = chat.add_generation_prompt;
  inputs.bos_token = tokenizer_->bos_token();
  inputs.eos_token = tokenizer_->eos_token();
  inputs.extra = chat.kwargs;
  return chat_template_->Render(inputs);
}

absl::StatusOr<std::vector<int32_t>> HfTextCodec::EncodeChat(const ChatPrompt& chat) const {
  PRL_ASSIGN_OR_RETURN(const std::string text, RenderChat(chat));
  return tokenizer_->Encode(text, /*add_special_tokens=*/false);
}

absl::StatusOr<std::string> HfTextCodec::DecodeCompletion(absl::Span<const int32_t> ids) const {
  return tokenizer_->Decode(ids, /*skip_special_tokens=*/true);
}

std::string HfTextCodec::Describe() const {
  return absl::StrCat("tokenizer.json of ", model_dir_, " (", tokenizer_->vocab_size(),
                      " tokens", chat_template_.has_value() ? ", chat template" : "", ")");
}

}  // namespace prl::tokenizer
