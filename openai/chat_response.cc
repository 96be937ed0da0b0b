#include "openai/chat_response.h"

#include <algorithm>

namespace prl::openai {

namespace {

using Json = nlohmann::ordered_json;

Json ToolCallsJson(const Completion& c, bool with_index) {
  Json calls = Json::array();
  for (size_t i = 0; i < c.tool_calls.size(); ++i) {
    const prl::v1::ToolCall& t = c.tool_calls[i];
    Json call = Json::object();
    if (with_index) call["index"] = i;
    call["id"] = t.id();
    call["type"] = "function";
    call["function"] = {{"name", t.name()}, {"arguments", t.arguments_json()}};
    calls.push_back(std::move(call));
  }
  return calls;
}

Json LogprobsJson(const Completion& c) {
  if (!c.with_logprobs) return Json();
  const size_t first = c.logprobs.size() - std::min(c.logprobs.size(), c.token_texts.size());
  if (!c.chat) {  // the legacy completions shape
    Json tokens = Json::array(), logprobs = Json::array(), top = Json::array();
    for (size_t i = 0; i < c.token_texts.size(); ++i) {
      tokens.push_back(c.token_texts[i]);
      logprobs.push_back(c.logprobs[first + i]);
      Json alternatives = Json::object();
      for (const auto& [text, lp] : c.top_logprobs[i]) alternatives[text] = lp;
      top.push_back(std::move(alternatives));
    }
    return {{"tokens", tokens}, {"token_logprobs", logprobs}, {"top_logprobs", top}};
  }
  Json content = Json::array();
  for (size_t i = 0; i < c.token_texts.size(); ++i) {
    const std::string& text = c.token_texts[i];
    Json top = Json::array();
    for (const auto& [alt, lp] : c.top_logprobs[i]) {
      top.push_back({{"token", alt},
                     {"logprob", lp},
                     {"bytes", std::vector<uint8_t>(alt.begin(), alt.end())}});
    }
    content.push_back({{"token", text},
                       {"logprob", c.logprobs[first + i]},
                       {"bytes", std::vector<uint8_t>(text.begin(), text.end())},
                       {"top_logprobs", std::move(top)}});
  }
  return {{"content", std::move(content)}};
}

Json Usage(const Completion& c) {
  const int64_t completion = static_cast<int64_t>(c.token_ids.size());
  return {{"prompt_tokens", c.prompt_tokens},
          {"completion_tokens", completion},
          {"total_tokens", c.prompt_tokens + completion}};
}

Json PrlFields(const Completion& c) {
  return {{"token_ids", c.token_ids},
          {"logprobs", c.logprobs},
          {"weight_versions", c.versions},
          {"token_sources", c.sources},
          {"prompt_tokens", c.prompt_tokens}};
}

Json Header(const Completion& c, bool chunk) {
  return {{"id", c.id},
          {"object",
           c.chat ? (chunk ? "chat.completion.chunk" : "chat.completion") : "text_completion"},
          {"created", c.created},
          {"model", c.model}};
}

}  // namespace

Json CompletionJson(const Completion& c) {
  Json out = Header(c, false);
  Json choice = {{"index", 0}};
  if (c.chat) {
    Json message = {{"role", "assistant"}};
    message["content"] = c.content.empty() && !c.tool_calls.empty() ? Json() : Json(c.content);
    if (!c.reasoning_content.empty()) message["reasoning_content"] = c.reasoning_content;
    if (!c.tool_calls.empty()) message["tool_calls"] = ToolCallsJson(c, false);
    choice["message"] = std::move(message);
  } else {
    choice["text"] = c.content;
  }
  choice["logprobs"] = LogprobsJson(c);
  choice["finish_reason"] = c.finish_reason;
  out["choices"] = Json::array({std::move(choice)});
  out["usage"] = Usage(c);
  out["prl"] = PrlFields(c);
  return out;
}

Json FirstChunkJson(const Completion& c) {
  Json out = Header(c, true);
  Json choice = {{"index", 0}};
  if (c.chat) {
    choice["delta"] = {{"role", "assistant"}, {"content", ""}};
  } else {
    choice["text"] = "";
  }
  choice["logprobs"] = Json();
  choice["finish_reason"] = Json();
  out["choices"] = Json::array({std::move(choice)});
  return out;
}

Json TextChunkJson(const Completion& c, const std::string& text) {
  Json out = Header(c, true);
  Json choice = {{"index", 0}};
  if (c.chat) {
    choice["delta"] = {{"content", text}};
  } else {
    choice["text"] = text;
  }
  choice["logprobs"] = Json();
  choice["finish_reason"] = Json();
  out["choices"] = Json::array({std::move(choice)});
  return out;
}

Json LastChunkJson(const Completion& c) {
  Json out = Header(c, true);
  Json choice = {{"index", 0}};
  if (c.chat) {
    Json delta = Json::object();
    if (!c.reasoning_content.empty()) delta["reasoning_content"] = c.reasoning_content;
    if (!c.tool_calls.empty()) delta["tool_calls"] = ToolCallsJson(c, true);
    choice["delta"] = std::move(delta);
  } else {
    choice["text"] = "";
  }
  choice["logprobs"] = LogprobsJson(c);
  choice["finish_reason"] = c.finish_reason;
  out["choices"] = Json::array({std::move(choice)});
  out["prl"] = PrlFields(c);
  return out;
}

Json UsageChunkJson(const Completion& c) {
  Json out = Header(c, true);
  out["choices"] = Json::array();
  out["usage"] = Usage(c);
  return out;
}

std::string Dump(const Json& json) {
  return json.dump(-1, ' ', false, Json::error_handler_t::replace);
}

std::string Event(const Json& chunk) { return "data: " + Dump(chunk) + "\n\n"; }

std::string Done() { return "data: [DONE]\n\n"; }

Json ModelsJson(const std::string& model, int64_t created) {
  return {{"object", "list"},
          {"data",
           Json::array(
               {{{"id", model}, {"object", "model"}, {"created", created}, {"owned_by", "prl"}}})}};
}

Json ErrorJson(const std::string& message, const std::string& type, const std::string& param) {
  return {{"error",
           {{"message", message},
            {"type", type},
            {"param", param.empty() ? Json() : Json(param)},
            {"code", Json()}}}};
}

}  // namespace prl::openai
