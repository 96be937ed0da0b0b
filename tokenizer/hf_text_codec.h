// The TextCodec of a model directory with Hugging Face tokenizer files: tokenizer.json (and
// tokenizer_config.json, generation_config.json) through tokenizer.h, and the chat template of
// tokenizer_config.json through chat_template/chat_template.h.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "tokenizer/chat_template/chat_template.h"
#include "tokenizer/text_codec.h"
#include "tokenizer/tokenizer.h"

namespace prl::tokenizer {

class HfTextCodec final : public TextCodec {
 public:
  // NotFound when `model_dir` has no tokenizer.json; other errors name the file and the JSON
  // path (an unsupported component, a template that does not parse).
  static absl::StatusOr<std::unique_ptr<HfTextCodec>> Load(const std::string& model_dir);

  absl::StatusOr<std::vector<int32_t>> EncodePrompt(absl::string_view text) const override;
  absl::StatusOr<std::vector<int32_t>> EncodeContinuation(absl::string_view text) const override;
  absl::StatusOr<std::string> RenderChat(const ChatPrompt& chat) const override;
  absl::StatusOr<std::vector<int32_t>> EncodeChat(const ChatPrompt& chat) const override;
  absl::StatusOr<std::string> DecodeCompletion(absl::Span<const int32_t> ids) const override;
  std::vector<int32_t> stop_ids() const override { return tokenizer_->stop_ids(); }
  int32_t vocab_size() const override { return tokenizer_->vocab_size(); }
  std::string ChatTemplateSource() const override {
    return tokenizer_->chat_template().value_or("");
  }
  std::string Describe() const override;

  const Tokenizer& tokenizer() const { return *tokenizer_; }

 private:
  HfTextCodec(std::string model_dir, std::unique_ptr<Tokenizer> tokenizer,
              std::optional<ChatTemplate> chat_template)
      : model_dir_(std::move(model_dir)),
        tokenizer_(std::move(tokenizer)),
        chat_template_(std::move(chat_template)) {}

  std::string model_dir_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::optional<ChatTemplate> chat_template_;
};

}  // namespace prl::tokenizer
