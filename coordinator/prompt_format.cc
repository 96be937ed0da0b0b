#include "coordinator/prompt_format.h"

#include <algorithm>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "coordinator/field_error.h"
#include "core/json_input.h"
#include "core/status_macros.h"
#include "nlohmann/json.hpp"

namespace prl::coordinator {

namespace {

namespace v1 = prl::v1;
using Json = nlohmann::ordered_json;

// A JSON field of a prompt line as text ("" when absent): an array or an object.
absl::StatusOr<std::string> JsonField(const Json& j, const char* key, bool array,
                                      const std::string& where) {
  if (!j.contains(key)) return std::string();
  if (array ? !j[key].is_array() : !j[key].is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": \"", key, "\" must be a JSON ", array ? "array" : "object"));
  }
  return j[key].dump();
}

absl::Status ParseChat(const Json& j, const std::string& where, v1::Chat* chat) {
  for (const auto& m : j["messages"]) {
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string() || !m.contains("content") ||
        !m["content"].is_string()) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": every message must be {\"role\": string, \"content\": string}, found ",
          m.dump()));
    }
    v1::ChatMessage* message = chat->add_messages();
    message->set_role(m["role"].get<std::string>());
    message->set_content(m["content"].get<std::string>());
  }
  PRL_ASSIGN_OR_RETURN(*chat->mutable_tools_json(), JsonField(j, "tools", true, where));
  PRL_ASSIGN_OR_RETURN(*chat->mutable_template_kwargs_json(),
                       JsonField(j, "chat_template_kwargs", false, where));
  return absl::OkStatus();
}

absl::Status ParseTokens(const Json& j, const std::string& where, v1::Prompt* p) {
  for (const auto& t : j["tokens"]) {
    // Checked before narrowing: 4294967297 is no token id, not token 1.
    const bool fits = t.is_number_unsigned() ? t.get<uint64_t>() <= INT32_MAX
                                             : t.is_number_integer() && t.get<int64_t>() >= 0 &&
                                                   t.get<int64_t>() <= INT32_MAX;
    if (!fits) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": \"tokens\": expected token ids from 0 to 2147483647, found ", JsonExcerpt(t)));
    }
    p->mutable_tokens()->add_ids(static_cast<int32_t>(t.get<int64_t>()));
  }
  return absl::OkStatus();
}

// A JSON value of a Chat field ("" means `empty`).
absl::StatusOr<Json> ParseJsonField(const std::string& text, const std::string& field, Json empty) {
  if (text.empty()) return empty;
  PRL_ASSIGN_OR_RETURN(Json j, ParseJsonInput(text, field));
  if (j.type() != empty.type()) {
    return Invalid(field, absl::StrCat("a JSON ", empty.is_array() ? "array" : "object"),
                   absl::StrCat("'", text.substr(0, 80), "'"));
  }
  return j;
}

}  // namespace

v1::EpisodePrompt EpisodePromptOf(const v1::Prompt& prompt) {
  v1::EpisodePrompt out;
  if (prompt.content_case() == v1::Prompt::kText) out.set_text(prompt.text());
  if (prompt.content_case() == v1::Prompt::kChat) *out.mutable_chat() = prompt.chat();
  return out;
}

absl::StatusOr<tokenizer::ChatPrompt> ToChatPrompt(const v1::Chat& chat, const std::string& field) {
  if (chat.messages().empty()) return Invalid(field + ".messages", "at least one", "none");
  tokenizer::ChatPrompt out;
  for (const v1::ChatMessage& m : chat.messages()) {
    out.messages.push_back({{"role", m.role()}, {"content", m.content()}});
  }
  PRL_ASSIGN_OR_RETURN(out.tools,
                       ParseJsonField(chat.tools_json(), field + ".tools_json", Json::array()));
  if (out.tools.empty()) out.tools = nullptr;
  PRL_ASSIGN_OR_RETURN(out.kwargs, ParseJsonField(chat.template_kwargs_json(),
                                                  field + ".template_kwargs_json", Json::object()));
  return out;
}

absl::Status ParsePromptLine(const std::string& line, const std::string& where, v1::Prompt* p) {
  PRL_ASSIGN_OR_RETURN(const Json j, ParseJsonInput(line, where));
  if (!j.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": expected one JSON object, found ", JsonTypeName(j)));
  }
  if (j.contains("text") && j["text"].is_string()) {
    p->set_text(j["text"].get<std::string>());
  } else if (j.contains("tokens") && j["tokens"].is_array()) {
    PRL_RETURN_IF_ERROR(ParseTokens(j, where, p));
  } else if (j.contains("messages") && j["messages"].is_array()) {
    PRL_RETURN_IF_ERROR(ParseChat(j, where, p->mutable_chat()));
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": expected {\"text\": ...}, {\"tokens\": [...]} or {\"messages\": [...]}"));
  }
  if (j.contains("reference")) {
    if (!j["reference"].is_string()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": \"reference\" must be a string"));
    }
    p->set_reference(j["reference"].get<std::string>());
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<v1::Prompt>> ReadPromptFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open prompts file ", path));
  std::vector<v1::Prompt> prompts;
  std::string text;
  for (int line = 1; std::getline(in, text); ++line) {
    if (text.find_first_not_of(" \t\r") == std::string::npos) continue;
    PRL_RETURN_IF_ERROR(
        ParsePromptLine(text, absl::StrCat(path, " line ", line), &prompts.emplace_back()));
  }
  return prompts;
}

void FillEnvironmentDefaults(int32_t max_tokens, double max_timeout_s, v1::EnvironmentSpec* e) {
  if (e->max_turns() == 0) e->set_max_turns(8);
  if (e->max_tokens_per_turn() == 0) e->set_max_tokens_per_turn(max_tokens);
  if (e->timeout_s() == 0) e->set_timeout_s(std::min(30.0, max_timeout_s));
}

void FillAgentDefaults(int32_t max_tokens, double max_timeout_s, v1::AgentSpec* a) {
  if (a->max_calls() == 0) a->set_max_calls(16);
  if (a->max_tokens_per_call() == 0) a->set_max_tokens_per_call(max_tokens);
  if (a->timeout_s() == 0) a->set_timeout_s(std::min(300.0, max_timeout_s));
}

absl::StatusOr<std::vector<int32_t>> PromptTokens(const v1::Prompt& p,
                                                  const tokenizer::TextCodec* text,
                                                  int64_t vocab_size, const std::string& field) {
  std::vector<int32_t> tokens;
  if (p.content_case() == v1::Prompt::kTokens) {
    tokens.assign(p.tokens().ids().begin(), p.tokens().ids().end());
  } else if (p.content_case() == v1::Prompt::kText || p.content_case() == v1::Prompt::kChat) {
    const bool is_text = p.content_case() == v1::Prompt::kText;
    const std::string where = absl::StrCat(field, is_text ? ".text" : ".chat");
    if (text == nullptr) {
      return Invalid(where, "token ids (this model has no tokenizer)", is_text ? "text" : "a chat");
    }
    absl::StatusOr<std::vector<int32_t>> encoded;
    if (is_text) {
      encoded = text->EncodePrompt(p.text());
    } else {
      PRL_ASSIGN_OR_RETURN(const tokenizer::ChatPrompt chat, ToChatPrompt(p.chat(), where));
      encoded = text->EncodeChat(chat);
    }
    if (!encoded.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": ", encoded.status().message()));
    }
    tokens = std::move(*encoded);
  } else {
    return Invalid(field, "text, messages or tokens", "none of them");
  }
  if (tokens.empty()) return Invalid(field, "at least one token", "an empty prompt");
  for (size_t j = 0; j < tokens.size(); ++j) {
    if (tokens[j] < 0 || tokens[j] >= vocab_size) {
      return Invalid(absl::StrCat(field, ".tokens[", j, "]"),
                     absl::StrCat("a token id in [0, ", vocab_size, ")"), absl::StrCat(tokens[j]));
    }
  }
  return tokens;
}

}  // namespace prl::coordinator
