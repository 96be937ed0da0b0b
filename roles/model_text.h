// The text of a model directory (tokenizer/text_codec.h): its own Hugging Face tokenizer and
// chat template when it has tokenizer.json; else, for the built-in arithmetic task's models
// (created by prl run without tokenizer files), the task's character tokenizer. A model with
// neither takes token prompts only: NotFound, which the roles report as "text prompts are not
// accepted" rather than failing.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "config/run_config.h"
#include "tokenizer/text_codec.h"

namespace prl::roles {

absl::StatusOr<std::shared_ptr<const tokenizer::TextCodec>> OpenModelText(
    const config::RunConfig& config, const std::string& model_dir, int64_t model_vocab_size);

}  // namespace prl::roles
