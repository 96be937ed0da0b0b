#include "tokenizer/chat_template/chat_template.h"

#include "absl/strings/str_cat.h"
#include "core/json_input.h"
#include "core/status_macros.h"
#include "tokenizer/chat_template/interpreter.h"
#include "tokenizer/chat_template/lexer.h"
#include "tokenizer/chat_template/parser.h"

namespace prl::tokenizer {

absl::StatusOr<ChatTemplate> ChatTemplate::Parse(absl::string_view source) {
  PRL_ASSIGN_OR_RETURN(const std::vector<jinja::Token> tokens, jinja::Lex(source));
  PRL_ASSIGN_OR_RETURN(jinja::Body body, jinja::Parse(tokens));
  return ChatTemplate(std::make_shared<const jinja::Body>(std::move(body)));
}

namespace {

// The conversion to jinja values, their destruction and the filters recurse: a value nested
// deeper than any parse of outside JSON allows (core/json_input.h) is refused here as well.
absl::Status CheckDepth(const nlohmann::ordered_json& value, absl::string_view name) {
  const int depth = JsonDepth(value);
  if (depth <= kMaxJsonDepth) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(name, ": expected JSON nested at most ", kMaxJsonDepth, " deep, found ", depth));
}

}  // namespace

absl::StatusOr<std::string> ChatTemplate::Render(const ChatTemplateInputs& inputs) const {
  PRL_RETURN_IF_ERROR(CheckDepth(inputs.messages, "messages"));
  PRL_RETURN_IF_ERROR(CheckDepth(inputs.tools, "tools"));
  PRL_RETURN_IF_ERROR(CheckDepth(inputs.extra, "chat_template_kwargs"));
  jinja::Value::Dict globals;
  globals.emplace_back("messages", jinja::Value::FromJson(inputs.messages));
  if (!inputs.tools.is_null()) globals.emplace_back("tools", jinja::Value::FromJson(inputs.tools));
  globals.emplace_back("add_generation_prompt", jinja::Value(inputs.add_generation_prompt));
  if (!inputs.bos_token.empty()) globals.emplace_back("bos_token", jinja::Value(inputs.bos_token));
  if (!inputs.eos_token.empty()) globals.emplace_back("eos_token", jinja::Value(inputs.eos_token));
  if (inputs.extra.is_object()) {
    for (const auto& [key, value] : inputs.extra.items()) {
      globals.emplace_back(key, jinja::Value::FromJson(value));
    }
  }
  std::string out;
  jinja::Interpreter interpreter(std::move(globals));
  PRL_RETURN_IF_ERROR(interpreter.Run(*body_, &out));
  return out;
}

}  // namespace prl::tokenizer
