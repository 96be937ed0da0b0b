#include "episode/tool_calls.h"

#include <cstdio>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "core/json_input.h"
#include "core/xxhash_inline.h"
#include "nlohmann/json.hpp"

namespace prl::episode {

namespace {

using Json = nlohmann::ordered_json;

constexpr absl::string_view kOpen = "<tool_call>", kClose = "</tool_call>";
constexpr absl::string_view kPythonTag = "<|python_tag|>";

std::string CallId(absl::string_view seed, size_t index) {
  const std::string key = absl::StrCat(seed, "#", index);
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx",
                static_cast<unsigned long long>(XXH3_64bits(key.data(), key.size())));
  return absl::StrCat("call_", hex);
}

// One call's JSON object: {"name": string, "arguments" (or "parameters"): object or string}.
// Returns an error in words ("" when it parsed).
std::string ParseCall(absl::string_view body, absl::string_view seed, size_t index,
                      std::vector<prl::v1::ToolCall>* calls) {
  const std::string where = absl::StrCat("tool call ", index + 1);
  absl::StatusOr<Json> parsed = ParseJsonInput(body, where);
  if (!parsed.ok() && absl::StrContains(parsed.status().message(), "nested at most")) {
    return std::string(parsed.status().message());
  }
  if (!parsed.ok()) {
    return absl::StrCat(where, ": expected a JSON object, found '",
                        std::string(body.substr(0, 120)), "'");
  }
  const Json& j = *parsed;
  if (!j.is_object()) {
    return absl::StrCat(where, ": expected a JSON object, found '",
                        std::string(body.substr(0, 120)), "'");
  }
  if (!j.contains("name") || !j["name"].is_string() || j["name"].get<std::string>().empty()) {
    return absl::StrCat(where, ": \"name\": expected the function's name, found ",
                        j.contains("name") ? j["name"].dump() : std::string("none"));
  }
  const char* key = j.contains("arguments") ? "arguments" : "parameters";
  std::string arguments = "{}";
  if (j.contains(key)) {
    const Json& a = j[key];
    const bool text_of_an_object = a.is_string() && [&] {
      // One level less than a call: written back (WriteToolCall) inside the call's object.
      const absl::StatusOr<Json> inner = ParseJsonInput(a.get_ref<const std::string&>(), where,
                                                        JsonLimits{.max_depth = kMaxJsonDepth - 1});
      return inner.ok() && inner->is_object();
    }();
    if (a.is_object()) {
      arguments = a.dump();
    } else if (text_of_an_object) {
      arguments = a.get<std::string>();  // arguments already as JSON text
    } else {
      return absl::StrCat(where, ": \"", key, "\": expected a JSON object, found ",
                          a.dump().substr(0, 120));
    }
  }
  prl::v1::ToolCall& call = calls->emplace_back();
  call.set_id(CallId(seed, index));
  call.set_name(j["name"].get<std::string>());
  call.set_arguments_json(arguments);
  return "";
}

ParsedTurn ParseHermes(absl::string_view text, absl::string_view seed) {
  ParsedTurn out;
  std::string content;
  size_t at = 0;
  for (;;) {
    const size_t open = text.find(kOpen, at);
    if (open == absl::string_view::npos) break;
    absl::StrAppend(&content, text.substr(at, open - at));
    const size_t body = open + kOpen.size();
    const size_t close = text.find(kClose, body);
    if (close == absl::string_view::npos) {
      out.error =
          absl::StrCat("tool call ", out.calls.size() + 1, ": ", kOpen, " without ", kClose);
      at = text.size();
      break;
    }
    const std::string error = ParseCall(absl::StripAsciiWhitespace(text.substr(body, close - body)),
                                        seed, out.calls.size(), &out.calls);
    if (!error.empty() && out.error.empty()) out.error = error;
    at = close + kClose.size();
  }
  if (at < text.size()) absl::StrAppend(&content, text.substr(at));
  out.content = std::string(absl::StripAsciiWhitespace(content));
  return out;
}

// llama3_json's calls, one JSON object after another separated by ';' (as vLLM reads them): a
// ';' inside a string is text ("SELECT 1; SELECT 2"). Parts are trimmed; empty ones dropped.
std::vector<absl::string_view> SplitCalls(absl::string_view body) {
  std::vector<absl::string_view> parts;
  bool in_string = false, escaped = false;
  size_t start = 0;
  const auto cut = [&](size_t end) {
    const absl::string_view part = absl::StripAsciiWhitespace(body.substr(start, end - start));
    if (!part.empty()) parts.push_back(part);
    start = end + 1;
  };
  for (size_t i = 0; i < body.size(); ++i) {
    const char c = body[i];
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == ';') {
      cut(i);
    }
  }
  cut(body.size());
  return parts;
}

ParsedTurn ParseLlama3Json(absl::string_view text, absl::string_view seed) {
  ParsedTurn out;
  absl::string_view body = absl::StripAsciiWhitespace(text);
  if (absl::StartsWith(body, kPythonTag)) {
    body = absl::StripAsciiWhitespace(body.substr(kPythonTag.size()));
  }
  if (body.empty() || body.front() != '{') {  // no call: the turn is content
    out.content = std::string(absl::StripAsciiWhitespace(text));
    return out;
  }
  for (absl::string_view part : SplitCalls(body)) {
    const std::string error = ParseCall(part, seed, out.calls.size(), &out.calls);
    if (!error.empty()) {
      out.error = error;
      break;
    }
  }
  return out;
}

}  // namespace

absl::string_view ToolCallFormatName(ToolCallFormat format) {
  switch (format) {
    case ToolCallFormat::kHermes:
      return "hermes";
    case ToolCallFormat::kLlama3Json:
      return "llama3_json";
    case ToolCallFormat::kNone:
      break;
  }
  return "none";
}

ToolCallFormat DetectToolCallFormat(const tokenizer::TextCodec& codec) {
  const std::string source = codec.ChatTemplateSource();
  if (absl::StrContains(source, kOpen)) return ToolCallFormat::kHermes;
  if (absl::StrContains(source, kPythonTag) ||
      source.find("\"parameters\": dictionary of argument name") != std::string::npos) {
    return ToolCallFormat::kLlama3Json;
  }
  return ToolCallFormat::kNone;
}

absl::StatusOr<ToolCallFormat> ToolCallFormatOf(absl::string_view name,
                                                const tokenizer::TextCodec& codec,
                                                absl::string_view field) {
  if (name.empty()) return DetectToolCallFormat(codec);
  for (ToolCallFormat f :
       {ToolCallFormat::kNone, ToolCallFormat::kHermes, ToolCallFormat::kLlama3Json}) {
    if (name == ToolCallFormatName(f)) return f;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      field, ": expected \"\" (from the chat template), hermes, llama3_json or none, found '",
      std::string(name.substr(0, 64)), "'"));
}

std::string WriteToolCall(ToolCallFormat format, const std::string& name,
                          const std::string& arguments_json) {
  const std::string quoted = Json(name).dump();
  switch (format) {
    case ToolCallFormat::kHermes: {
      // The reader cuts a call at the first </tool_call>: inside the JSON (where '<' can only
      // be in a string) "</" is written "<\/", the same text to a JSON parser.
      const std::string call =
          absl::StrCat("{\"name\": ", quoted, ", \"arguments\": ", arguments_json, "}");
      return absl::StrCat(kOpen, "\n", absl::StrReplaceAll(call, {{"</", "<\\/"}}), "\n", kClose);
    }
    case ToolCallFormat::kLlama3Json:
      return absl::StrCat("{\"name\": ", quoted, ", \"parameters\": ", arguments_json, "}");
    default:
      return "";
  }
}

ParsedTurn ParseToolCalls(ToolCallFormat format, absl::string_view text,
                          absl::string_view id_seed) {
  switch (format) {
    case ToolCallFormat::kHermes:
      return ParseHermes(text, id_seed);
    case ToolCallFormat::kLlama3Json:
      return ParseLlama3Json(text, id_seed);
    case ToolCallFormat::kNone:
      break;
  }
  ParsedTurn out;
  out.content = std::string(text);
  return out;
}

}  // namespace prl::episode
