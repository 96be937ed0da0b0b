#include "openai/chat_request.h"

#include <cmath>
#include <set>

#include "absl/strings/str_cat.h"
#include "core/json_input.h"
#include "core/status_macros.h"

namespace prl::openai {

namespace {

using Json = nlohmann::ordered_json;

absl::Status Invalid(const std::string& field, const std::string& expected,
                     const std::string& found) {
  return absl::InvalidArgumentError(
      absl::StrCat(field, ": expected ", expected, ", found ", found));
}

// A value in an error: short JSON.
std::string Found(const Json& value) { return JsonExcerpt(value); }

// Whether `object` has the member `key` equal to the string `expected` (any other type: no).
bool HasString(const Json& object, const char* key, const char* expected) {
  if (!object.is_object()) return false;
  const auto it = object.find(key);
  return it != object.end() && it->is_string() && it->get_ref<const std::string&>() == expected;
}

absl::StatusOr<std::string> String(const Json& value, const std::string& field,
                                   const ChatLimits& limits) {
  if (!value.is_string()) return Invalid(field, "a string", Found(value));
  const std::string& s = value.get_ref<const std::string&>();
  if (s.size() > limits.max_string_bytes) {
    return Invalid(field, absl::StrCat("at most ", limits.max_string_bytes, " bytes"),
                   absl::StrCat(s.size(), " bytes"));
  }
  return s;
}

// A message's content: a string, an array of text parts (joined), or null (an assistant that
// only calls tools).
absl::StatusOr<std::string> Content(const Json& value, const std::string& field,
                                    const ChatLimits& limits) {
  if (value.is_null()) return std::string();
  if (value.is_string()) return String(value, field, limits);
  if (!value.is_array()) return Invalid(field, "a string or an array of text parts", Found(value));
  std::string text;
  for (size_t i = 0; i < value.size(); ++i) {
    const std::string at = absl::StrCat(field, "[", i, "]");
    const Json& part = value[i];
    if (!HasString(part, "type", "text") || !part.contains("text")) {
      return Invalid(at,
                     "a text part {\"type\": \"text\", \"text\": ...} (images and audio are "
                     "not served)",
                     Found(part));
    }
    PRL_ASSIGN_OR_RETURN(const std::string piece, String(part["text"], at + ".text", limits));
    text += piece;
  }
  if (text.size() > limits.max_string_bytes) {
    return Invalid(field, absl::StrCat("at most ", limits.max_string_bytes, " bytes"),
                   absl::StrCat(text.size(), " bytes"));
  }
  return text;
}

absl::Status KnownFields(const Json& object, const std::string& where,
                         const std::set<std::string>& known) {
  for (const auto& [key, value] : object.items()) {
    if (known.count(key) == 0) {
      return absl::InvalidArgumentError(absl::StrCat(where.empty() ? "" : where + ".", key,
                                                     ": not a field this endpoint serves"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<Json> ToolCalls(const Json& value, const std::string& field,
                               const ChatLimits& limits) {
  if (!value.is_array()) return Invalid(field, "an array of tool calls", Found(value));
  Json out = Json::array();
  for (size_t i = 0; i < value.size(); ++i) {
    const std::string at = absl::StrCat(field, "[", i, "]");
    const Json& call = value[i];
    if (!call.is_object()) return Invalid(at, "a tool call object", Found(call));
    if (call.contains("type") && call["type"] != "function") {
      return Invalid(at + ".type", "\"function\"", Found(call["type"]));
    }
    if (!call.contains("function") || !call["function"].is_object()) {
      return Invalid(at + ".function", "{\"name\", \"arguments\"}",
                     call.contains("function") ? Found(call["function"]) : "none");
    }
    const Json& fn = call["function"];
    PRL_ASSIGN_OR_RETURN(const std::string name,
                         String(fn.value("name", Json()), at + ".function.name", limits));
    PRL_ASSIGN_OR_RETURN(const std::string arguments, String(fn.value("arguments", Json("{}")),
                                                             at + ".function.arguments", limits));
    absl::StatusOr<Json> parsed = ParseJsonInput(arguments, at + ".function.arguments");
    if (!parsed.ok()) return parsed.status();
    if (!parsed->is_object()) {
      return Invalid(at + ".function.arguments", "a JSON object as a string",
                     Found(Json(arguments)));
    }
    PRL_ASSIGN_OR_RETURN(const std::string id, call.contains("id") && !call["id"].is_null()
                                                   ? String(call["id"], at + ".id", limits)
                                                   : absl::StatusOr<std::string>(std::string()));
    Json normal = {{"id", id},
                   {"type", "function"},
                   {"function", {{"name", name}, {"arguments", *std::move(parsed)}}}};
    out.push_back(std::move(normal));
  }
  return out;
}

absl::StatusOr<Json> Messages(const Json& value, const ChatLimits& limits) {
  if (!value.is_array() || value.empty()) {
    return Invalid("messages", "a non-empty array", Found(value));
  }
  if (static_cast<int>(value.size()) > limits.max_messages) {
    return Invalid("messages", absl::StrCat("at most ", limits.max_messages),
                   absl::StrCat(value.size()));
  }
  Json out = Json::array();
  for (size_t i = 0; i < value.size(); ++i) {
    const std::string at = absl::StrCat("messages[", i, "]");
    const Json& m = value[i];
    if (!m.is_object()) return Invalid(at, "a message object", Found(m));
    PRL_RETURN_IF_ERROR(
        KnownFields(m, at,
                    {"role", "content", "name", "tool_calls", "tool_call_id", "refusal",
                     "annotations", "function_call", "reasoning_content"}));
    if (m.contains("function_call") && !m["function_call"].is_null()) {
      return Invalid(at + ".function_call", "null (use tool_calls)", Found(m["function_call"]));
    }
    PRL_ASSIGN_OR_RETURN(std::string role, String(m.value("role", Json()), at + ".role", limits));
    if (role == "developer") role = "system";  // OpenAI's newer name for the system prompt
    if (role != "system" && role != "user" && role != "assistant" && role != "tool") {
      return Invalid(at + ".role", "system, developer, user, assistant or tool",
                     absl::StrCat("\"", role.substr(0, 32), "\""));
    }
    Json message = {{"role", role}};
    PRL_ASSIGN_OR_RETURN(message["content"],
                         Content(m.value("content", Json()), at + ".content", limits));
    if (m.contains("name")) {
      PRL_ASSIGN_OR_RETURN(message["name"], String(m["name"], at + ".name", limits));
    }
    if (role == "assistant" && m.contains("reasoning_content") &&
        !m["reasoning_content"].is_null()) {
      PRL_ASSIGN_OR_RETURN(message["reasoning_content"],
                           String(m["reasoning_content"], at + ".reasoning_content", limits));
    }
    if (m.contains("tool_calls") && !m["tool_calls"].is_null()) {
      if (role != "assistant") {
        return Invalid(at + ".tool_calls", "none on a " + role + " message", "tool calls");
      }
      PRL_ASSIGN_OR_RETURN(message["tool_calls"],
                           ToolCalls(m["tool_calls"], at + ".tool_calls", limits));
    }
    if (role == "tool") {
      PRL_ASSIGN_OR_RETURN(message["tool_call_id"],
                           String(m.value("tool_call_id", Json()), at + ".tool_call_id", limits));
    }
    out.push_back(std::move(message));
  }
  return out;
}

absl::StatusOr<Json> Tools(const Json& value, const ChatLimits& limits) {
  if (value.is_null()) return Json();
  if (!value.is_array()) return Invalid("tools", "an array of tools", Found(value));
  if (static_cast<int>(value.size()) > limits.max_tools) {
    return Invalid("tools", absl::StrCat("at most ", limits.max_tools), absl::StrCat(value.size()));
  }
  for (size_t i = 0; i < value.size(); ++i) {
    const std::string at = absl::StrCat("tools[", i, "]");
    const Json& tool = value[i];
    if (!HasString(tool, "type", "function") || !tool.contains("function") ||
        !tool["function"].is_object()) {
      return Invalid(at, "{\"type\": \"function\", \"function\": {\"name\", ...}}", Found(tool));
    }
    PRL_RETURN_IF_ERROR(
        String(tool["function"].value("name", Json()), at + ".function.name", limits).status());
    if (tool.dump().size() > limits.max_string_bytes) {
      return Invalid(at, absl::StrCat("at most ", limits.max_string_bytes, " bytes"),
                     absl::StrCat(tool.dump().size(), " bytes"));
    }
  }
  return value.empty() ? Json() : value;
}

absl::Status ToolChoiceOf(const Json& value, ChatCall* call) {
  if (value.is_null()) return absl::OkStatus();
  if (value.is_string()) {
    const std::string& s = value.get_ref<const std::string&>();
    if (s == "auto")
      call->tool_choice = ToolChoice::kAuto;
    else if (s == "none")
      call->tool_choice = ToolChoice::kNone;
    else if (s == "required")
      call->tool_choice = ToolChoice::kRequired;
    else
      return Invalid("tool_choice", "auto, none, required or a function", Found(value));
    return absl::OkStatus();
  }
  if (!HasString(value, "type", "function") || !value.contains("function") ||
      !value["function"].is_object() || !value["function"].contains("name") ||
      !value["function"]["name"].is_string()) {
    return Invalid("tool_choice", "{\"type\": \"function\", \"function\": {\"name\"}}",
                   Found(value));
  }
  call->tool_choice = ToolChoice::kFunction;
  call->tool_choice_function = value["function"]["name"].get<std::string>();
  return absl::OkStatus();
}

// The sampling fields both endpoints share.
absl::Status Sampling(const Json& body, const ChatLimits& limits, ChatCall* call) {
  const auto number = [&](const char* key, double lo, double hi, bool lo_open,
                          double* out) -> absl::Status {
    if (!body.contains(key) || body[key].is_null()) return absl::OkStatus();
    const Json& v = body[key];
    const std::string range = absl::StrCat(lo_open ? "(" : "[", lo, ", ", hi, "]");
    if (!v.is_number() || !std::isfinite(v.get<double>()) || v.get<double>() > hi ||
        (lo_open ? v.get<double>() <= lo : v.get<double>() < lo)) {
      return Invalid(key, absl::StrCat("a number in ", range), Found(v));
    }
    *out = v.get<double>();
    return absl::OkStatus();
  };
  double temperature = -1, top_p = -1;
  PRL_RETURN_IF_ERROR(number("temperature", 0, 2, false, &temperature));
  PRL_RETURN_IF_ERROR(number("top_p", 0, 1, true, &top_p));
  if (temperature >= 0) call->temperature = static_cast<float>(temperature);
  if (top_p >= 0) call->top_p = static_cast<float>(top_p);
  for (const char* key : {"max_tokens", "max_completion_tokens"}) {
    if (!body.contains(key) || body[key].is_null()) continue;
    const Json& v = body[key];
    if (!v.is_number_integer() || v.get<int64_t>() < 1 || v.get<int64_t>() > (1 << 20)) {
      return Invalid(key, "an integer from 1 to 1048576", Found(v));
    }
    call->max_tokens = static_cast<int32_t>(v.get<int64_t>());
  }
  if (body.contains("n") && !body["n"].is_null() && body["n"] != 1) {
    return Invalid("n", "1 (a call continues one trajectory of its episode)", Found(body["n"]));
  }
  if (body.contains("stop") && !body["stop"].is_null()) {
    const Json& stop = body["stop"];
    const Json list = stop.is_string() ? Json::array({stop}) : stop;
    if (!list.is_array() || static_cast<int>(list.size()) > limits.max_stops) {
      return Invalid("stop", absl::StrCat("a string or up to ", limits.max_stops, " strings"),
                     Found(stop));
    }
    for (size_t i = 0; i < list.size(); ++i) {
      const std::string at = absl::StrCat("stop[", i, "]");
      if (!list[i].is_string() || list[i].get_ref<const std::string&>().empty() ||
          list[i].get_ref<const std::string&>().size() > limits.max_stop_bytes) {
        return Invalid(at, absl::StrCat("1 to ", limits.max_stop_bytes, " bytes"), Found(list[i]));
      }
      call->stop.push_back(list[i].get<std::string>());
    }
  }
  if (body.contains("seed") && !body["seed"].is_null()) {
    if (!body["seed"].is_number_integer())
      return Invalid("seed", "an integer", Found(body["seed"]));
    call->seed = static_cast<uint64_t>(body["seed"].get<int64_t>());
  }
  if (body.contains("stream") && !body["stream"].is_null()) {
    if (!body["stream"].is_boolean())
      return Invalid("stream", "true or false", Found(body["stream"]));
    call->stream = body["stream"].get<bool>();
  }
  if (body.contains("stream_options") && !body["stream_options"].is_null()) {
    const Json& o = body["stream_options"];
    if (!o.is_object()) return Invalid("stream_options", "an object", Found(o));
    PRL_RETURN_IF_ERROR(KnownFields(o, "stream_options", {"include_usage"}));
    PRL_ASSIGN_OR_RETURN(call->include_usage,
                         MemberBool(o, "include_usage", "stream_options", false));
  }
  if (body.contains("model") && !body["model"].is_null()) {
    PRL_ASSIGN_OR_RETURN(call->model, String(body["model"], "model", limits));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ChatCall> ParseChatRequest(const Json& body, const ChatLimits& limits) {
  if (!body.is_object()) return Invalid("the request body", "a JSON object", Found(body));
  PRL_RETURN_IF_ERROR(KnownFields(
      body, "",
      {"model", "messages", "tools", "tool_choice", "parallel_tool_calls", "temperature", "top_p",
       "max_tokens", "max_completion_tokens", "stop", "seed", "logprobs", "top_logprobs", "stream",
       "stream_options", "n", "user", "frequency_penalty", "presence_penalty"}));
  for (const char* penalty : {"frequency_penalty", "presence_penalty"}) {
    if (body.contains(penalty) && !body[penalty].is_null() && body[penalty] != 0) {
      return Invalid(penalty, "0 (penalties would change the distribution the learner scores)",
                     Found(body[penalty]));
    }
  }
  ChatCall call;
  PRL_ASSIGN_OR_RETURN(call.messages, Messages(body.value("messages", Json()), limits));
  PRL_ASSIGN_OR_RETURN(call.tools, Tools(body.value("tools", Json()), limits));
  PRL_RETURN_IF_ERROR(ToolChoiceOf(body.value("tool_choice", Json()), &call));
  if (call.tool_choice == ToolChoice::kFunction) {
    bool known = false;
    for (const Json& tool : call.tools.is_null() ? Json::array() : call.tools) {
      known = known || tool["function"]["name"] == call.tool_choice_function;
    }
    if (!known) {
      return Invalid("tool_choice.function.name", "the name of one of the request's tools",
                     absl::StrCat("\"", call.tool_choice_function.substr(0, 64), "\""));
    }
  }
  if (call.tool_choice == ToolChoice::kRequired && call.tools.is_null()) {
    return Invalid("tool_choice", "auto or none without tools", "\"required\"");
  }
  PRL_RETURN_IF_ERROR(Sampling(body, limits, &call));
  if (body.contains("logprobs") && !body["logprobs"].is_null()) {
    if (!body["logprobs"].is_boolean()) {
      return Invalid("logprobs", "true or false", Found(body["logprobs"]));
    }
    call.logprobs = body["logprobs"].get<bool>();
  }
  if (body.contains("top_logprobs") && !body["top_logprobs"].is_null()) {
    const Json& v = body["top_logprobs"];
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > 20) {
      return Invalid("top_logprobs", "an integer from 0 to 20", Found(v));
    }
    if (!call.logprobs && v.get<int64_t>() > 0) {
      return Invalid("top_logprobs", "logprobs: true with it", Found(v));
    }
    call.top_logprobs = static_cast<int32_t>(v.get<int64_t>());
  }
  return call;
}

absl::StatusOr<ChatCall> ParseChatRequestBody(absl::string_view body, const ChatLimits& limits) {
  PRL_ASSIGN_OR_RETURN(const Json json, ParseJsonInput(body, "the request body"));
  return ParseChatRequest(json, limits);
}

absl::StatusOr<ChatCall> ParseCompletionRequestBody(absl::string_view body,
                                                    const ChatLimits& limits) {
  PRL_ASSIGN_OR_RETURN(const Json json, ParseJsonInput(body, "the request body"));
  return ParseCompletionRequest(json, limits);
}

absl::StatusOr<ChatCall> ParseCompletionRequest(const Json& body, const ChatLimits& limits) {
  if (!body.is_object()) return Invalid("the request body", "a JSON object", Found(body));
  PRL_RETURN_IF_ERROR(
      KnownFields(body, "",
                  {"model", "prompt", "temperature", "top_p", "max_tokens", "stop", "seed",
                   "logprobs", "stream", "stream_options", "n", "user", "echo"}));
  if (body.contains("echo") && !body["echo"].is_null() && body["echo"] != false) {
    return Invalid("echo", "false", Found(body["echo"]));
  }
  ChatCall call;
  call.chat = false;
  const Json& prompt = body.value("prompt", Json());
  if (prompt.is_string()) {
    PRL_ASSIGN_OR_RETURN(call.prompt_text, String(prompt, "prompt", limits));
  } else if (prompt.is_array() && !prompt.empty() && prompt[0].is_number_integer()) {
    if (prompt.size() > limits.max_string_bytes / 4) {
      return Invalid("prompt", absl::StrCat("at most ", limits.max_string_bytes / 4, " token ids"),
                     absl::StrCat(prompt.size()));
    }
    for (size_t i = 0; i < prompt.size(); ++i) {
      // Checked before narrowing: 4294967297 is no token id, not token 1.
      const Json& id = prompt[i];
      const bool fits =
          id.is_number_unsigned()
              ? id.get<uint64_t>() <= INT32_MAX
              : id.is_number_integer() && id.get<int64_t>() >= 0 && id.get<int64_t>() <= INT32_MAX;
      if (!fits) {
        return Invalid(absl::StrCat("prompt[", i, "]"), "a token id from 0 to 2147483647",
                       Found(id));
      }
      call.prompt_ids.push_back(static_cast<int32_t>(id.get<int64_t>()));
    }
  } else {
    return Invalid("prompt", "a string or an array of token ids (one prompt)", Found(prompt));
  }
  PRL_RETURN_IF_ERROR(Sampling(body, limits, &call));
  if (body.contains("logprobs") && !body["logprobs"].is_null()) {
    const Json& v = body["logprobs"];
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > 5) {
      return Invalid("logprobs", "an integer from 0 to 5 (alternatives per token)", Found(v));
    }
    call.logprobs = true;
    call.top_logprobs = static_cast<int32_t>(v.get<int64_t>());
  }
  return call;
}

}  // namespace prl::openai
