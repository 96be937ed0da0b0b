// Prompts as users write them and as the model reads them, in one place for the coordinator
// (submissions), `prl submit` (prompt files) and `prl run` (its task's files).
//
// A prompt line (JSONL) is one of
//   {"text": "..."}                      tokenised with the model's tokenizer
//   {"tokens": [int, ...]}               token ids of the model's vocabulary
//   {"messages": [{"role", "content"}...], "tools"?: [...], "chat_template_kwargs"?: {...}}
//                                        rendered with the model's chat template
// with an optional "reference": "..." (what the reward compares with).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "prl/v1/prompt.pb.h"
#include "tokenizer/text_codec.h"

namespace prl::coordinator {

// One line; errors start with `where` (e.g. "prompts.jsonl line 3") and name the field.
absl::Status ParsePromptLine(const std::string& line, const std::string& where,
                             prl::v1::Prompt* prompt);
// Every non-blank line of a file.
absl::StatusOr<std::vector<prl::v1::Prompt>> ReadPromptFile(const std::string& path);

// A prompt as submitted, for an agentic episode (LeasedPrompt.episode_prompt): its text or its
// chat; empty for a prompt given as token ids.
prl::v1::EpisodePrompt EpisodePromptOf(const prl::v1::Prompt& prompt);

// A chat prompt as the chat template renders it (messages, tools, template variables); errors
// name `field`'s parts (".messages", ".tools_json", ".template_kwargs_json").
absl::StatusOr<tokenizer::ChatPrompt> ToChatPrompt(const prl::v1::Chat& chat,
                                                   const std::string& field);

// The token ids a prompt stands for: text and chats through `text` (null: refused, naming
// `field`), token ids as given; every id checked against `vocab_size`.
absl::StatusOr<std::vector<int32_t>> PromptTokens(const prl::v1::Prompt& prompt,
                                                  const tokenizer::TextCodec* text,
                                                  int64_t vocab_size, const std::string& field);

// A prompt set's environment with its defaults filled in, as the actors get it: max_turns 8,
// max_tokens_per_turn the set's sampling.max_tokens, timeout_s 30 or max_timeout_s when lower
// (coordinator.max_env_timeout_s; 0 means the default).
void FillEnvironmentDefaults(int32_t max_tokens, double max_timeout_s,
                             prl::v1::EnvironmentSpec* environment);
// A prompt set's agent with its defaults filled in: max_calls 16, max_tokens_per_call the set's
// sampling.max_tokens, timeout_s 300 or max_timeout_s when lower
// (coordinator.max_agent_timeout_s).
void FillAgentDefaults(int32_t max_tokens, double max_timeout_s, prl::v1::AgentSpec* agent);

}  // namespace prl::coordinator
