#include "episode/trajectory.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "episode/turn_renderer.h"

namespace prl::episode {

namespace {

using Json = nlohmann::ordered_json;
using openai::ChatCall;
using openai::ToolChoice;

constexpr absl::string_view kThinkOpen = "<think>", kThinkClose = "</think>";
constexpr absl::string_view kHermesOpen = "<tool_call>";

bool ToolsActive(const ChatCall& call, ToolCallFormat format) {
  return call.chat && !call.tools.is_null() && call.tool_choice != ToolChoice::kNone &&
         format != ToolCallFormat::kNone;
}

// The length of the longest suffix of `text` that is a proper prefix of `word`.
size_t PartialSuffix(absl::string_view text, absl::string_view word) {
  for (size_t n = std::min(text.size(), word.size() - 1); n > 0; --n) {
    if (absl::EndsWith(text, word.substr(0, n))) return n;
  }
  return 0;
}

// `text` cut at the first stop string; `*stopped` whether one was there.
absl::string_view CutAtStop(absl::string_view text, const ChatCall& call, bool* stopped) {
  size_t cut = absl::string_view::npos;
  for (const std::string& stop : call.stop) cut = std::min(cut, text.find(stop));
  *stopped = cut != absl::string_view::npos;
  return *stopped ? text.substr(0, cut) : text;
}

// A chat answer's text split into the think block it opens with (an unclosed one is all
// reasoning) and the rest.
void SplitReasoning(absl::string_view text, std::string* reasoning, absl::string_view* rest) {
  absl::string_view lead = absl::StripLeadingAsciiWhitespace(text);
  reasoning->clear();
  *rest = text;
  if (!absl::StartsWith(lead, kThinkOpen)) return;
  lead.remove_prefix(kThinkOpen.size());
  const size_t close = lead.find(kThinkClose);
  *reasoning = std::string(absl::StripAsciiWhitespace(lead.substr(0, close)));
  *rest = close == absl::string_view::npos
              ? absl::string_view()
              : absl::StripLeadingAsciiWhitespace(lead.substr(close + kThinkClose.size()));
}

// Bytes at the end of `text` that begin a UTF-8 character not yet complete.
size_t IncompleteUtf8(absl::string_view text) {
  for (size_t back = 1; back <= std::min<size_t>(3, text.size()); ++back) {
    const unsigned char c = static_cast<unsigned char>(text[text.size() - back]);
    if ((c & 0xC0) == 0x80) continue;  // a continuation byte: look further back
    const size_t length = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    return length > back ? back : 0;
  }
  return 0;
}

prl::v1::EnvMessage EnvMessageOf(const Json& m) {
  prl::v1::EnvMessage out;
  out.set_role(m.value("role", ""));
  out.set_content(m.value("content", ""));
  if (m.contains("name")) out.set_name(m["name"].get<std::string>());
  if (m.contains("tool_call_id")) out.set_tool_call_id(m["tool_call_id"].get<std::string>());
  return out;
}

// Why `call`'s messages do not extend `open`'s ("" when they do).
std::string WhyNotContinued(const Trajectory& open, const ChatCall& call) {
  if (!open.chat) return "the trajectory was a text completion's";
  if (open.tools != call.tools) return "the tools changed";
  if (call.messages.size() <= open.messages.size()) {
    return absl::StrCat("the call has ", call.messages.size(),
                        " messages, not more than the trajectory's ", open.messages.size());
  }
  for (size_t i = 0; i < open.messages.size(); ++i) {
    if (!SameMessage(call.messages[i], open.messages[i])) {
      return absl::StrCat("messages[", i, "] differs from the trajectory's (a ",
                          open.messages[i].value("role", ""), " message ",
                          i + 1 == open.messages.size() ? "the endpoint answered" : "sent before",
                          ")");
    }
  }
  for (size_t i = open.messages.size(); i < call.messages.size(); ++i) {
    if (call.messages[i].value("role", "") == "assistant") {
      return absl::StrCat("messages[", i, "] is an assistant message the model did not write");
    }
  }
  return "";
}

}  // namespace

bool SameMessage(const Json& a, const Json& b) {
  const auto text = [](const Json& m, const char* key) {
    return m.contains(key) && m[key].is_string() ? m[key].get<std::string>() : std::string();
  };
  for (const char* key : {"role", "content", "name", "tool_call_id"}) {
    if (text(a, key) != text(b, key)) return false;
  }
  const Json none = Json::array();
  const Json& ca = a.contains("tool_calls") && a["tool_calls"].is_array() ? a["tool_calls"] : none;
  const Json& cb = b.contains("tool_calls") && b["tool_calls"].is_array() ? b["tool_calls"] : none;
  if (ca.size() != cb.size()) return false;
  for (size_t i = 0; i < ca.size(); ++i) {
    if (ca[i].value("id", "") != cb[i].value("id", "") ||
        ca[i]["function"].value("name", "") != cb[i]["function"].value("name", "") ||
        ca[i]["function"].value("arguments", Json()) != cb[i]["function"].value("arguments", Json())) {
      return false;
    }
  }
  return true;
}

absl::StatusOr<CallPrompt> StartCall(const tokenizer::TextCodec& codec, const Trajectory* open,
                                    const ChatCall& call, const Json& kwargs) {
  CallPrompt start;
  if (!call.chat) {
    start.next.chat = false;
    start.next.by_ids = !call.prompt_ids.empty();
    if (open != nullptr && !open->chat && open->by_ids == start.next.by_ids) {
      if (start.next.by_ids && call.prompt_ids.size() >= open->ids.size() &&
          std::equal(open->ids.begin(), open->ids.end(), call.prompt_ids.begin())) {
        start.continues = true;
        start.tokens.assign(call.prompt_ids.begin() + open->ids.size(), call.prompt_ids.end());
      } else if (!start.next.by_ids && absl::StartsWith(call.prompt_text, open->text)) {
        start.continues = true;
        PRL_ASSIGN_OR_RETURN(start.tokens, codec.EncodeContinuation(absl::string_view(
                                               call.prompt_text).substr(open->text.size())));
      }
    }
    if (!start.continues && open != nullptr) {
      start.split = open->chat ? "the trajectory was a chat's"
                               : "the prompt does not begin with the trajectory so far";
    }
    start.next.text = call.prompt_text;
    start.next.ids = call.prompt_ids;
    if (!start.continues) {
      if (start.next.by_ids) {
        start.tokens = call.prompt_ids;
      } else {
        PRL_ASSIGN_OR_RETURN(start.tokens, codec.EncodePrompt(call.prompt_text));
      }
    }
    return start;
  }
  const Json& last = call.messages.back();
  if (last.value("role", "") == "assistant") {
    return absl::InvalidArgumentError(
        absl::StrCat("messages[", call.messages.size() - 1,
                     "]: expected the conversation to end with a user, tool or system message "
                     "for the model to answer, found an assistant message (continuing the "
                     "assistant's own message is not served)"));
  }
  start.next.chat = true;
  start.next.messages = call.messages;
  start.next.tools = call.tools;
  if (open != nullptr) start.split = WhyNotContinued(*open, call);
  if (open != nullptr && start.split.empty()) {
    EnvMessages delta;
    for (size_t i = open->messages.size(); i < call.messages.size(); ++i) {
      *delta.Add() = EnvMessageOf(call.messages[i]);
    }
    ChatContext context;
    context.tools = call.tools;
    context.kwargs = kwargs;
    absl::StatusOr<std::vector<int32_t>> tokens =
        RenderReply(codec, delta, open->last_token, context);
    if (!tokens.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("messages[", open->messages.size(), "..]: ", tokens.status().message()));
    }
    start.continues = true;
    start.tokens = *std::move(tokens);
    return start;
  }
  tokenizer::ChatPrompt prompt;
  prompt.messages = call.messages;
  prompt.tools = call.tools;
  prompt.kwargs = kwargs;
  prompt.add_generation_prompt = true;
  absl::StatusOr<std::vector<int32_t>> tokens = codec.EncodeChat(prompt);
  if (!tokens.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("messages: the model's chat template cannot render them: ",
                     tokens.status().message()));
  }
  start.tokens = *std::move(tokens);
  return start;
}

std::string ForcedOpening(ToolCallFormat format, const ChatCall& call) {
  if (call.tools.is_null() || (call.tool_choice != ToolChoice::kRequired &&
                               call.tool_choice != ToolChoice::kFunction)) {
    return "";
  }
  const bool named = call.tool_choice == ToolChoice::kFunction;
  const std::string name = Json(call.tool_choice_function).dump();  // quoted, escaped
  switch (format) {
    case ToolCallFormat::kHermes:
      return named ? absl::StrCat(kHermesOpen, "\n{\"name\": ", name, ", \"arguments\": ")
                   : absl::StrCat(kHermesOpen, "\n");
    case ToolCallFormat::kLlama3Json:
      return named ? absl::StrCat("{\"name\": ", name, ", \"parameters\": ") : "{\"name\": \"";
    default:
      return "";
  }
}

AnswerText ReadAnswer(absl::string_view text, const ChatCall& call, ToolCallFormat format,
                      bool by_length, absl::string_view id_seed) {
  AnswerText out;
  bool stopped = false;
  const absl::string_view cut = CutAtStop(text, call, &stopped);
  absl::string_view rest = cut;
  if (call.chat) SplitReasoning(cut, &out.reasoning, &rest);
  if (ToolsActive(call, format)) {
    ParsedTurn parsed = ParseToolCalls(format, rest, id_seed);
    if (parsed.error.empty()) {
      out.content = std::move(parsed.content);
      out.tool_calls = std::move(parsed.calls);
    } else {  // not a call after all: the text, as the model wrote it
      out.content = std::string(absl::StripAsciiWhitespace(rest));
    }
  } else {
    out.content = std::string(rest);
  }
  out.finish_reason = by_length && !stopped  ? "length"
                      : out.tool_calls.empty() ? "stop"
                                               : "tool_calls";
  return out;
}

std::string VisibleContent(absl::string_view text, const ChatCall& call, ToolCallFormat format) {
  bool stopped = false;
  absl::string_view t = CutAtStop(text, call, &stopped);
  if (!stopped) {
    size_t hold = 0;
    for (const std::string& stop : call.stop) hold = std::max(hold, PartialSuffix(t, stop));
    t.remove_suffix(hold);
  }
  if (call.chat) {
    const absl::string_view lead = absl::StripLeadingAsciiWhitespace(t);
    if (lead.empty() || absl::StartsWith(kThinkOpen, lead)) return "";  // may open a think block
    if (absl::StartsWith(lead, kThinkOpen)) {
      const size_t close = lead.find(kThinkClose);
      if (close == absl::string_view::npos) return "";  // reasoning, not content
      t = absl::StripLeadingAsciiWhitespace(lead.substr(close + kThinkClose.size()));
    }
  }
  if (ToolsActive(call, format)) {
    if (format != ToolCallFormat::kHermes) return "";  // a JSON call is the whole answer
    const size_t open = t.find(kHermesOpen);
    if (open != absl::string_view::npos) {
      t = t.substr(0, open);
    } else {
      t.remove_suffix(PartialSuffix(t, kHermesOpen));
    }
    t = absl::StripAsciiWhitespace(t);  // the final content is trimmed
  }
  t.remove_suffix(IncompleteUtf8(t));
  return std::string(t);
}

Trajectory Answered(const CallPrompt& start, const AnswerText& answer,
                    absl::Span<const int32_t> answer_tokens) {
  Trajectory next = start.next;
  next.ids.insert(next.ids.end(), answer_tokens.begin(), answer_tokens.end());
  if (next.chat) {
    Json message = {{"role", "assistant"}, {"content", answer.content}};
    if (!answer.tool_calls.empty()) {
      Json calls = Json::array();
      for (const prl::v1::ToolCall& c : answer.tool_calls) {
        calls.push_back({{"id", c.id()},
                         {"type", "function"},
                         {"function",
                          {{"name", c.name()},
                           {"arguments", Json::parse(c.arguments_json(), nullptr, false)}}}});
      }
      message["tool_calls"] = std::move(calls);
    }
    next.messages.push_back(std::move(message));
  } else {
    next.text += answer.content;
  }
  if (!answer_tokens.empty()) next.last_token = answer_tokens.back();
  return next;
}

}  // namespace prl::episode
