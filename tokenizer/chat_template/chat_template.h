// A model's chat template (tokenizer_config.json's "chat_template", Jinja): messages and
// tools -> the prompt text, as transformers' apply_chat_template renders it. The Jinja subset
// is what the Qwen2.5, Qwen3 and Llama 3.x templates use (lexer.h, parser.h, interpreter.h,
// filters.h); a template using anything else is an error naming the construct and its line,
// reported by Parse where it can be known from the text and by Render otherwise.
//
// Thread-safety: immutable after Parse; Render may run concurrently (each call has its own
// interpreter).
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace prl::tokenizer {

namespace jinja {
struct Stmt;
}

struct ChatTemplateInputs {
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();  // [{"role", "content"...}]
  nlohmann::ordered_json tools;  // null: the variable `tools` is undefined
  bool add_generation_prompt = false;
  std::string bos_token, eos_token;  // "" leaves the variable undefined
  // More variables (e.g. {"enable_thinking": false}); keys must not repeat those above.
  nlohmann::ordered_json extra = nlohmann::ordered_json::object();
};

class ChatTemplate {
 public:
  static absl::StatusOr<ChatTemplate> Parse(absl::string_view source);

  absl::StatusOr<std::string> Render(const ChatTemplateInputs& inputs) const;

 private:
  explicit ChatTemplate(std::shared_ptr<const std::vector<jinja::Stmt>> body)
      : body_(std::move(body)) {}
  std::shared_ptr<const std::vector<jinja::Stmt>> body_;
};

}  // namespace prl::tokenizer
