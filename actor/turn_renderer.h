// The tokens an environment's reply adds to an episode, rendered as a delta: only the new
// messages, never the conversation again (earlier tokens are never re-tokenized, so the learner
// trains on exactly what the engine sampled).
//
// With a chat template: the template renders a fixed stand-in conversation (a user message, an
// assistant message) without and then with the new messages and the next assistant turn
// opened; the reply is what the second has after the stand-in assistant's content, checked to
// begin as the first ends that turn (a template that closes the turn differently when more
// follows is refused naming why). What comes before the content may differ between the two
// (Qwen3's template gives only the last assistant turn an empty think block): it is never used.
// It starts with the template's end of an assistant turn; when the model's turn already ended
// with that token (its stop token), it is not repeated. Without a chat template (the built-in
// character tokenizer): each message's content and a newline.
//
// Thread-safety: pure functions of an immutable codec.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "google/protobuf/repeated_ptr_field.h"
#include "prl/v1/environment.pb.h"
#include "tokenizer/text_codec.h"

namespace prl::actor {

// `last_token`: the model turn's last token (dropped from the reply's start when equal).
absl::StatusOr<std::vector<int32_t>> RenderReply(
    const tokenizer::TextCodec& codec,
    const google::protobuf::RepeatedPtrField<prl::v1::EnvMessage>& messages, int32_t last_token);

}  // namespace prl::actor
