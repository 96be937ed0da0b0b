// The episode protocol's pure parts (proto/prl/v1/environment.proto, docs/environments.md),
// shared by the episode engine and the warm-start's demonstrations: the requests an episode
// sends, how a turn ended, and the token budget of the next turn within the episode's limits.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <string>

#include "absl/types/span.h"
#include "episode/group.h"
#include "episode/tool_calls.h"
#include "prl/v1/environment.pb.h"
#include "tokenizer/text_codec.h"

namespace prl::episode {

// StartEpisodeRequest of one sample: prompt_text is a text prompt's text, a chat prompt's last
// user message, else the prompt's ids decoded; prompt_messages a chat prompt's messages.
prl::v1::StartEpisodeRequest StartRequestOf(const GroupRequest& group, int32_t sample,
                                            const std::string& episode_id,
                                            const tokenizer::TextCodec& codec);

// Why a turn ended: a stop token (END_OF_TURN), a stop string (the engine's end_turn, or
// EndTurn: STOP_STRING, also on the turn's last allowed token), else its budget (MAX_TOKENS).
prl::v1::TurnEnd TurnEndOf(const TurnOutput& turn, absl::Span<const int32_t> stop_token_ids);

// The StepRequest of a model turn: its text (decoded, special tokens left out) and token ids, how
// it ended, and, with a tool-call format, its calls and content (episode/tool_calls.h; call ids
// from "<episode id>/<turn index>", the same on every retry).
absl::StatusOr<prl::v1::StepRequest> StepRequestOf(const std::string& episode_id,
                                                   int32_t turn_index, const TurnOutput& turn,
                                                   const tokenizer::TextCodec& codec,
                                                   absl::Span<const int32_t> stop_token_ids,
                                                   ToolCallFormat format);

// The next model turn's token budget, or why the episode ends there (the actor then ends it
// as truncated with EndEpisode): min(max_tokens_per_turn, max_episode_tokens - episode tokens,
// max_sequence_tokens - sequence tokens).
struct TurnBudget {
  int32_t max_tokens = 0;  // >= 1 when `truncate` is empty
  std::string truncate;    // "max_episode_tokens 4096", "context 2048"
};
// `sequence_tokens`: prompt and completion so far (the reply included); `episode_tokens`: the
// completion's (the model's and the environments').
TurnBudget NextTurnBudget(int64_t sequence_tokens, int64_t episode_tokens,
                          int64_t max_sequence_tokens, const prl::v1::EnvironmentSpec& spec);

}  // namespace prl::episode
