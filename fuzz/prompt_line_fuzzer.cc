// libFuzzer target for prompt lines (coordinator/prompt_format.h) as a tenant submits them, on
// through the coordinator's tokenisation of a prompt set's prompts (PromptTokens, what
// SubmitPromptSetRequest's validation runs for each) with real chat templates: Qwen3's (tools,
// tool calls, reasoning, enable_thinking) and Llama 3's, from fuzz/chat_templates/. The codec
// stands in for the tokenizer (one id per byte), so that all the time goes to parsing and
// rendering.
//
// Beyond "no crash, no sanitizer report, no hang" (no throw, no stack exhausted by nesting), an
// error starts with what it is about (the line's place, the chat's or the prompt's field); an
// accepted chat becomes a ChatPrompt whose messages are a non-empty array, tools null or a
// non-empty array, kwargs an object; tokenised prompts are non-empty and within the vocabulary,
// and a prompt given as ids keeps them. The same entry point replays fuzz/corpus/prompt_line in
// ctest.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "coordinator/prompt_format.h"
#include "tokenizer/chat_template/chat_template.h"

namespace {

using prl::tokenizer::ChatPrompt;
using prl::tokenizer::ChatTemplate;

constexpr int32_t kVocab = 256;

// A TextCodec with a real chat template and a byte-level stand-in tokenizer.
class TemplateCodec final : public prl::tokenizer::TextCodec {
 public:
  explicit TemplateCodec(const std::string& name) : template_(Load(name)) {}

  absl::StatusOr<std::vector<int32_t>> EncodePrompt(absl::string_view text) const override {
    std::vector<int32_t> ids;
    for (const char c : text) ids.push_back(static_cast<unsigned char>(c));
    return ids;
  }
  absl::StatusOr<std::string> RenderChat(const ChatPrompt& chat) const override {
    prl::tokenizer::ChatTemplateInputs inputs;
    inputs.messages = chat.messages;
    inputs.tools = chat.tools;
    inputs.add_generation_prompt = chat.add_generation_prompt;
    inputs.bos_token = "<bos>";
    inputs.eos_token = "<eos>";
    inputs.extra = chat.kwargs;
    return template_.Render(inputs);
  }
  absl::StatusOr<std::vector<int32_t>> EncodeChat(const ChatPrompt& chat) const override {
    absl::StatusOr<std::string> text = RenderChat(chat);
    if (!text.ok()) return text.status();
    return EncodePrompt(*text);
  }
  absl::StatusOr<std::vector<int32_t>> EncodeContinuation(absl::string_view text) const override {
    return EncodePrompt(text);
  }
  absl::StatusOr<std::string> DecodeCompletion(absl::Span<const int32_t> ids) const override {
    return std::string(ids.begin(), ids.end());
  }
  std::vector<int32_t> stop_ids() const override { return {}; }
  int32_t vocab_size() const override { return kVocab; }
  std::string Describe() const override { return "fuzz template codec"; }

 private:
  static ChatTemplate Load(const std::string& name) {
    std::ifstream in(std::string(PRL_FUZZ_DIR) + "/chat_templates/" + name + ".jinja");
    std::stringstream source;
    source << in.rdbuf();
    absl::StatusOr<ChatTemplate> parsed = ChatTemplate::Parse(source.str());
    if (!in || !parsed.ok()) std::abort();  // the templates are ours: they must load
    return *std::move(parsed);
  }

  ChatTemplate template_;
};

void CheckTokens(const prl::v1::Prompt& prompt, const prl::tokenizer::TextCodec& codec) {
  const absl::StatusOr<std::vector<int32_t>> tokens =
      prl::coordinator::PromptTokens(prompt, &codec, kVocab, "prompts[0]");
  if (!tokens.ok()) {
    if (tokens.status().message().rfind("prompts[0]", 0) != 0) std::abort();
    return;
  }
  if (tokens->empty()) std::abort();
  for (const int32_t id : *tokens) {
    if (id < 0 || id >= kVocab) std::abort();
  }
  if (prompt.has_tokens() &&
      !std::equal(tokens->begin(), tokens->end(), prompt.tokens().ids().begin(),
                  prompt.tokens().ids().end())) {
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const TemplateCodec* const qwen3 = new TemplateCodec("qwen3");
  static const TemplateCodec* const llama3 = new TemplateCodec("llama3");
  const std::string line(reinterpret_cast<const char*>(data), size);
  prl::v1::Prompt prompt;
  const absl::Status parsed =
      prl::coordinator::ParsePromptLine(line, "prompts.jsonl line 1", &prompt);
  if (!parsed.ok()) {
    if (parsed.message().rfind("prompts.jsonl line 1: ", 0) != 0) std::abort();
    return 0;
  }
  if (prompt.has_chat()) {
    const absl::StatusOr<ChatPrompt> chat = prl::coordinator::ToChatPrompt(prompt.chat(), "chat");
    if (!chat.ok()) {
      if (chat.status().message().rfind("chat.", 0) != 0) std::abort();
    } else if (!chat->messages.is_array() || chat->messages.empty() || !chat->kwargs.is_object() ||
               !(chat->tools.is_null() || (chat->tools.is_array() && !chat->tools.empty()))) {
      std::abort();
    }
  }
  CheckTokens(prompt, *qwen3);
  CheckTokens(prompt, *llama3);
  return 0;
}
