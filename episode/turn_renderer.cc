#include "episode/turn_renderer.h"

#include "absl/strings/str_cat.h"
#include "coordinator/prompt_format.h"
#include "core/json_input.h"
#include "core/status_macros.h"

namespace prl::episode {

namespace {

using Json = nlohmann::ordered_json;

Json Message(const std::string& role, const std::string& content) {
  Json m = Json::object();
  m["role"] = role;
  m["content"] = content;
  return m;
}

Json MessageOf(const prl::v1::EnvMessage& m) {
  Json message = Message(m.role(), m.content());
  if (!m.name().empty()) message["name"] = m.name();
  if (!m.tool_call_id().empty()) message["tool_call_id"] = m.tool_call_id();
  return message;
}

// The stand-in assistant's content: a marker that no message of the reply contains (a reply that
// quoted it would otherwise be cut at the wrong place).
std::string MarkerFor(const EnvMessages& messages) {
  std::string marker = "PRL-STAND-IN-7f3a";
  const auto used = [&] {
    for (const prl::v1::EnvMessage& m : messages) {
      if (m.content().find(marker) != std::string::npos ||
          m.name().find(marker) != std::string::npos) {
        return true;
      }
    }
    return false;
  };
  for (int i = 0; used(); ++i) marker = absl::StrCat("PRL-STAND-IN-7f3a-", i);
  return marker;
}

}  // namespace

absl::StatusOr<ChatContext> ChatContextOf(const prl::v1::EpisodePrompt& prompt) {
  ChatContext context;
  if (!prompt.has_chat()) return context;
  PRL_ASSIGN_OR_RETURN(const tokenizer::ChatPrompt chat,
                       coordinator::ToChatPrompt(prompt.chat(), "episode prompt chat"));
  context.tools = chat.tools;
  context.kwargs = chat.kwargs;
  return context;
}

absl::StatusOr<std::vector<int32_t>> RenderReply(const tokenizer::TextCodec& codec,
                                                 const EnvMessages& messages, int32_t last_token,
                                                 const ChatContext& context) {
  if (messages.empty()) return std::vector<int32_t>();
  const std::string marker = MarkerFor(messages);
  tokenizer::ChatPrompt base;
  base.messages.push_back(Message("user", "PRL-STAND-IN-USER"));
  base.messages.push_back(Message("assistant", marker));
  base.tools = context.tools;
  base.kwargs = context.kwargs;
  base.add_generation_prompt = false;
  absl::StatusOr<std::string> before = codec.RenderChat(base);
  if (absl::IsFailedPrecondition(before.status())) {  // no chat template: plain lines
    std::string text;
    for (const prl::v1::EnvMessage& m : messages) absl::StrAppend(&text, m.content(), "\n");
    return codec.EncodeContinuation(text);
  }
  PRL_RETURN_IF_ERROR(before.status());
  tokenizer::ChatPrompt full = base;
  for (const prl::v1::EnvMessage& m : messages) full.messages.push_back(MessageOf(m));
  full.add_generation_prompt = true;
  PRL_ASSIGN_OR_RETURN(const std::string after, codec.RenderChat(full));
  // What follows the stand-in assistant's content: its end of turn alone, then with the new
  // messages after it. (What comes before may differ — Qwen3's template gives the last
  // assistant turn an empty think block and earlier ones none — and is never re-rendered.)
  const size_t in_before = before->rfind(marker), in_after = after.rfind(marker);
  const std::string end_of_turn =
      in_before == std::string::npos ? "" : before->substr(in_before + marker.size());
  const std::string delta =
      in_after == std::string::npos ? "" : after.substr(in_after + marker.size());
  if (in_before == std::string::npos || in_after == std::string::npos ||
      delta.compare(0, end_of_turn.size(), end_of_turn) != 0) {
    return absl::FailedPreconditionError(
        "the chat template does not render an environment's messages after an assistant turn "
        "as a continuation of that turn: the reply cannot be appended as a delta");
  }
  PRL_ASSIGN_OR_RETURN(std::vector<int32_t> tokens, codec.EncodeContinuation(delta));
  if (!tokens.empty() && tokens.front() == last_token) tokens.erase(tokens.begin());
  return tokens;
}

absl::StatusOr<ChatContext> WithTools(ChatContext context, const std::string& tools_json) {
  if (tools_json.empty()) return context;
  absl::StatusOr<Json> parsed = ParseJsonInput(tools_json, "StartEpisodeResponse.tools_json");
  if (!parsed.ok()) return parsed.status();
  const Json& tools = *parsed;
  if (!tools.is_array()) {
    return absl::InvalidArgumentError(
        absl::StrCat("StartEpisodeResponse.tools_json: expected a JSON array of tools, found '",
                     tools_json.substr(0, 80), "'"));
  }
  if (context.tools.is_null()) context.tools = Json::array();
  for (const Json& tool : tools) {
    if (!tool.is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat("StartEpisodeResponse.tools_json: expected tool objects, found ",
                       tool.dump().substr(0, 80)));
    }
    context.tools.push_back(tool);
  }
  return context;
}

absl::StatusOr<std::vector<int32_t>> RenderFirstPrompt(const tokenizer::TextCodec& codec,
                                                       const prl::v1::Chat& chat,
                                                       const EnvMessages& observation,
                                                       const ChatContext& context) {
  PRL_ASSIGN_OR_RETURN(tokenizer::ChatPrompt prompt,
                       coordinator::ToChatPrompt(chat, "episode prompt chat"));
  prompt.tools = context.tools;
  prompt.kwargs = context.kwargs;
  for (const prl::v1::EnvMessage& m : observation) prompt.messages.push_back(MessageOf(m));
  prompt.add_generation_prompt = true;
  return codec.EncodeChat(prompt);
}

absl::StatusOr<std::vector<int32_t>> FirstPromptOf(const tokenizer::TextCodec& codec,
                                                   absl::Span<const int32_t> prompt,
                                                   const prl::v1::EpisodePrompt& submitted,
                                                   const EnvMessages& observation,
                                                   const ChatContext& context,
                                                   bool environment_tools) {
  if (environment_tools && !submitted.has_chat()) {
    return absl::FailedPreconditionError(
        "StartEpisodeResponse.tools_json: an environment's tools need a chat prompt (messages) "
        "to be rendered with; this prompt is text or token ids");
  }
  if (submitted.has_chat() && (!observation.empty() || environment_tools)) {
    return RenderFirstPrompt(codec, submitted.chat(), observation, context);
  }
  PRL_ASSIGN_OR_RETURN(std::vector<int32_t> tokens, RenderReply(codec, observation, -1, context));
  tokens.insert(tokens.begin(), prompt.begin(), prompt.end());
  return tokens;
}

}  // namespace prl::episode
