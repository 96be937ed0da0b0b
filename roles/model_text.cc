#include "roles/model_text.h"

#include "absl/strings/str_cat.h"
#include "task/char_text_codec.h"
#include "tokenizer/hf_text_codec.h"

namespace prl::roles {

absl::StatusOr<std::shared_ptr<const tokenizer::TextCodec>> OpenModelText(
    const config::RunConfig& config, const std::string& model_dir, int64_t model_vocab_size) {
  std::shared_ptr<const tokenizer::TextCodec> codec;
  absl::StatusOr<std::unique_ptr<tokenizer::HfTextCodec>> hf =
      tokenizer::HfTextCodec::Load(model_dir);
  if (hf.ok()) {
    codec = std::move(*hf);
  } else if (!absl::IsNotFound(hf.status())) {
    return hf.status();
  } else if (config.task.name != config::TaskName::kPrompts) {  // a built-in task
    codec = std::make_shared<task::CharTextCodec>();
  } else {
    return absl::NotFoundError(absl::StrCat(
        model_dir, " has no tokenizer.json: text and chat prompts need the model's tokenizer "
                   "(prl model init --tokenizer DIR copies one); token prompts work without"));
  }
  if (codec->vocab_size() > model_vocab_size) {
    return absl::FailedPreconditionError(
        absl::StrCat(codec->Describe(), " has ", codec->vocab_size(),
                     " tokens but the model's vocab_size is ", model_vocab_size));
  }
  return codec;
}

}  // namespace prl::roles
