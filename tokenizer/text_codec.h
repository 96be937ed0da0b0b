// TextCodec: what the service needs of a model's text, behind one interface. The coordinator
// encodes text and chat prompts with it, actors decode completions for text rewards and for
// clients that watch samples, and `prl run` encodes its task's prompts. Two implementations:
// the model's own Hugging Face tokenizer and chat template (hf_text_codec.h), and the built-in
// task's character tokenizer (task/char_text_codec.h) for models created on the fly without
// tokenizer files; roles/model_text.h picks one for a model directory.
//
// Thread-safety: implementations are immutable after construction; every method may be called
// from any number of threads at once.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "nlohmann/json.hpp"

namespace prl::tokenizer {

// A conversation to render with the chat template (transformers' apply_chat_template).
struct ChatPrompt {
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();  // [{"role", "content"}...]
  nlohmann::ordered_json tools;  // null: none
  // Extra template variables, e.g. {"enable_thinking": false}.
  nlohmann::ordered_json kwargs = nlohmann::ordered_json::object();
  // The assistant's turn opened at the end (a prompt to generate from); off to render a
  // finished conversation.
  bool add_generation_prompt = true;
};

class TextCodec {
 public:
  virtual ~TextCodec() = default;

  // The ids of a text prompt, framed as the model expects (BOS where the tokenizer adds one).
  virtual absl::StatusOr<std::vector<int32_t>> EncodePrompt(absl::string_view text) const = 0;
  // The prompt text of a conversation: the chat template, the generation prompt appended unless
  // the chat says otherwise. FailedPrecondition when there is no chat template.
  virtual absl::StatusOr<std::string> RenderChat(const ChatPrompt& chat) const = 0;
  // The ids of a rendered conversation: encoded without adding special tokens (the template
  // writes them), as apply_chat_template(tokenize=True) does.
  virtual absl::StatusOr<std::vector<int32_t>> EncodeChat(const ChatPrompt& chat) const = 0;
  // The ids of text that continues a prompt (a reference answer), no special tokens added.
  virtual absl::StatusOr<std::vector<int32_t>> EncodeContinuation(absl::string_view text) const = 0;
  // The text of completion ids, special tokens (EOS) left out: what a text reward reads.
  virtual absl::StatusOr<std::string> DecodeCompletion(absl::Span<const int32_t> ids) const = 0;
  // The ids that end a sample unless a request names its own (generation_config.json's
  // eos_token_id, else the tokenizer's EOS).
  virtual std::vector<int32_t> stop_ids() const = 0;
  // One past the largest id.
  virtual int32_t vocab_size() const = 0;
  // The chat template's source (Jinja); "" without one. What a model family's conventions
  // (e.g. its tool-call format: episode/tool_calls.h) are read from.
  virtual std::string ChatTemplateSource() const { return ""; }
  // For start-up lines: "tokenizer.json of DIR (151669 tokens, chat template)".
  virtual std::string Describe() const = 0;
};

}  // namespace prl::tokenizer
