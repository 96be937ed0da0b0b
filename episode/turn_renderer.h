// The tokens an episode's conversation gains, rendered with the model's chat template as a
// delta: only the new messages, never the conversation again (earlier tokens are never
// re-tokenized, so the learner trains on exactly what the engine sampled).
//
// RenderReply: an environment's reply after a model turn. The template renders a fixed stand-in
// conversation (a user message, an assistant message whose content is a marker no message of
// the reply contains) without and then with the new messages and the next assistant turn
// opened; the reply is what the second has after the stand-in assistant's content, checked to
// begin as the first ends that turn (a template that closes the turn differently when more
// follows is refused naming why). What comes before the content may differ between the two
// (Qwen3's template gives only the last assistant turn an empty think block): it is never used.
// It starts with the template's end of an assistant turn; when the model's turn already ended
// with that token (its stop token), it is not repeated. The prompt's template variables and
// tools (ChatContext: e.g. {"enable_thinking": false}) render every reply, as they rendered the
// prompt. Without a chat template (the built-in character tokenizer): each message's content
// and a newline.
//
// RenderFirstPrompt: a chat prompt's episode starts from the template's rendering of the
// prompt's messages followed by the first observation, the generation prompt opened: what
// apply_chat_template(messages + observation, add_generation_prompt=True) gives (never an empty
// assistant turn between the prompt and the observation).
//
// Thread-safety: pure functions of an immutable codec.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "google/protobuf/repeated_ptr_field.h"
#include "nlohmann/json.hpp"
#include "prl/v1/environment.pb.h"
#include "prl/v1/prompt.pb.h"
#include "tokenizer/text_codec.h"

namespace prl::episode {

using EnvMessages = google::protobuf::RepeatedPtrField<prl::v1::EnvMessage>;

// What renders every turn of one prompt's episodes besides the messages.
struct ChatContext {
  nlohmann::ordered_json tools;                                      // null: none
  nlohmann::ordered_json kwargs = nlohmann::ordered_json::object();  // template variables
};

// The context of a submitted chat prompt (its tools and template variables); empty for others.
absl::StatusOr<ChatContext> ChatContextOf(const prl::v1::EpisodePrompt& prompt);
// `context` with an environment's tools (StartEpisodeResponse.tools_json: a JSON array of
// objects; "" none) after the prompt's own. Errors name StartEpisodeResponse.tools_json.
absl::StatusOr<ChatContext> WithTools(ChatContext context, const std::string& tools_json);

// `last_token`: the model turn's last token (dropped from the reply's start when equal; -1:
// none, e.g. the first observation of a prompt that is not a chat).
absl::StatusOr<std::vector<int32_t>> RenderReply(const tokenizer::TextCodec& codec,
                                                 const EnvMessages& messages, int32_t last_token,
                                                 const ChatContext& context = {});

// The first prompt of a chat prompt's episode: its messages, then `observation`, the generation
// prompt opened, with the context's tools and template variables, tokenised as EncodeChat does.
absl::StatusOr<std::vector<int32_t>> RenderFirstPrompt(const tokenizer::TextCodec& codec,
                                                       const prl::v1::Chat& chat,
                                                       const EnvMessages& observation,
                                                       const ChatContext& context);

// What an episode's first turn continues: a chat prompt with an observation, or with tools of
// its environment's (`environment_tools`), as RenderFirstPrompt; any other prompt's `prompt`
// tokens followed by the observation rendered as a reply (RenderReply; none: the prompt alone).
// An environment's tools need a chat prompt (FailedPrecondition otherwise).
absl::StatusOr<std::vector<int32_t>> FirstPromptOf(const tokenizer::TextCodec& codec,
                                                   absl::Span<const int32_t> prompt,
                                                   const prl::v1::EpisodePrompt& submitted,
                                                   const EnvMessages& observation,
                                                   const ChatContext& context,
                                                   bool environment_tools = false);

}  // namespace prl::episode
