#include "actor/turn_renderer.h"

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"

namespace prl::actor {

namespace {

constexpr char kMarker[] = "PRL-STAND-IN-7f3a";  // the stand-in assistant's content

nlohmann::ordered_json Message(const std::string& role, const std::string& content) {
  nlohmann::ordered_json m = nlohmann::ordered_json::object();
  m["role"] = role;
  m["content"] = content;
  return m;
}

}  // namespace

absl::StatusOr<std::vector<int32_t>> RenderReply(
    const tokenizer::TextCodec& codec,
    const google::protobuf::RepeatedPtrField<prl::v1::EnvMessage>& messages, int32_t last_token) {
  if (messages.empty()) return std::vector<int32_t>();
  tokenizer::ChatPrompt base;
  base.messages.push_back(Message("user", "PRL-STAND-IN-USER"));
  base.messages.push_back(Message("assistant", kMarker));
  base.add_generation_prompt = false;
  absl::StatusOr<std::string> before = codec.RenderChat(base);
  if (absl::IsFailedPrecondition(before.status())) {  // no chat template: plain lines
    std::string text;
    for (const prl::v1::EnvMessage& m : messages) absl::StrAppend(&text, m.content(), "\n");
    return codec.EncodeContinuation(text);
  }
  PRL_RETURN_IF_ERROR(before.status());
  tokenizer::ChatPrompt full = base;
  for (const prl::v1::EnvMessage& m : messages) {
    nlohmann::ordered_json message = Message(m.role(), m.content());
    if (!m.name().empty()) message["name"] = m.name();
    full.messages.push_back(std::move(message));
  }
  full.add_generation_prompt = true;
  PRL_ASSIGN_OR_RETURN(const std::string after, codec.RenderChat(full));
  // What follows the stand-in assistant's content: its end of turn alone, then with the new
  // messages after it. (What comes before may differ — Qwen3's template gives the last
  // assistant turn an empty think block and earlier ones none — and is never re-rendered.)
  const size_t in_before = before->rfind(kMarker), in_after = after.rfind(kMarker);
  const std::string end_of_turn =
      in_before == std::string::npos ? "" : before->substr(in_before + sizeof(kMarker) - 1);
  const std::string delta =
      in_after == std::string::npos ? "" : after.substr(in_after + sizeof(kMarker) - 1);
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

}  // namespace prl::actor
