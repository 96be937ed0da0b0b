#include "episode/episode_protocol.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace prl::episode {

namespace v1 = prl::v1;

v1::StartEpisodeRequest StartRequestOf(const GroupRequest& group, int32_t sample,
                                       const std::string& episode_id,
                                       const tokenizer::TextCodec& codec) {
  v1::StartEpisodeRequest request;
  request.set_episode_id(episode_id);
  const v1::EnvironmentSpec& spec = *group.environment;
  request.set_environment(spec.name());
  if (group.submitted.has_chat()) {
    for (const v1::ChatMessage& m : group.submitted.chat().messages()) {
      v1::EnvMessage* out = request.add_prompt_messages();
      out->set_role(m.role());
      out->set_content(m.content());
      if (m.role() == "user") request.set_prompt_text(m.content());  // the last one wins
    }
  } else if (group.submitted.has_text()) {
    request.set_prompt_text(group.submitted.text());
  } else {
    absl::StatusOr<std::string> text = codec.DecodeCompletion(group.prompt);
    request.set_prompt_text(text.ok() ? *text : "");
  }
  request.set_reference(group.reference);
  *request.mutable_parameters() = spec.parameters();
  request.set_sample_index(sample);
  request.set_max_turns(spec.max_turns());
  return request;
}

v1::TurnEnd TurnEndOf(const TurnOutput& turn, absl::Span<const int32_t> stop_token_ids) {
  if (turn.reason == FinishReason::kLength) return v1::TURN_END_MAX_TOKENS;
  const bool stop_token =
      !turn.tokens.empty() && std::find(stop_token_ids.begin(), stop_token_ids.end(),
                                        turn.tokens.back()) != stop_token_ids.end();
  return stop_token ? v1::TURN_END_END_OF_TURN : v1::TURN_END_STOP_STRING;
}

absl::StatusOr<v1::StepRequest> StepRequestOf(const std::string& episode_id, int32_t turn_index,
                                              const TurnOutput& turn,
                                              const tokenizer::TextCodec& codec,
                                              absl::Span<const int32_t> stop_token_ids,
                                              ToolCallFormat format) {
  v1::StepRequest r;
  r.set_episode_id(episode_id);
  r.set_turn_index(turn_index);
  r.mutable_token_ids()->Assign(turn.tokens.begin(), turn.tokens.end());
  r.set_turn_end(TurnEndOf(turn, stop_token_ids));
  absl::StatusOr<std::string> text = codec.DecodeCompletion(turn.tokens);
  if (!text.ok()) return text.status();
  r.set_text(*text);
  if (format != ToolCallFormat::kNone) {  // the turn's calls, in the model's format
    ParsedTurn parsed = ParseToolCalls(format, r.text(), absl::StrCat(episode_id, "/", turn_index));
    r.set_content(std::move(parsed.content));
    for (v1::ToolCall& call : parsed.calls) *r.add_tool_calls() = std::move(call);
    r.set_tool_call_error(std::move(parsed.error));
  }
  return r;
}

TurnBudget NextTurnBudget(int64_t sequence_tokens, int64_t episode_tokens,
                          int64_t max_sequence_tokens, const v1::EnvironmentSpec& spec) {
  TurnBudget budget;
  int64_t room = spec.max_tokens_per_turn();
  if (spec.max_episode_tokens() > 0) {
    const int64_t left = spec.max_episode_tokens() - episode_tokens;
    if (left < 1) {
      budget.truncate = absl::StrCat("max_episode_tokens ", spec.max_episode_tokens());
      return budget;
    }
    room = std::min(room, left);
  }
  const int64_t context = max_sequence_tokens - sequence_tokens;
  if (context < 1) {
    budget.truncate = absl::StrCat("context ", max_sequence_tokens);
    return budget;
  }
  budget.max_tokens = static_cast<int32_t>(std::min(room, context));
  return budget;
}

}  // namespace prl::episode
