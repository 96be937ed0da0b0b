// Tool calls in the model's own format (docs/environments.md, "Tool calls"): a model turn's
// text parsed into OpenAI-style function calls, as vLLM's tool parsers read them:
//   hermes       <tool_call>{"name": "f", "arguments": {...}}</tool_call>, one block per call,
//                anywhere in the turn (Qwen2.5, Qwen3, Hermes; the text around them is the
//                turn's content);
//   llama3_json  the whole turn (after an optional <|python_tag|>) is one JSON object
//                {"name": "f", "parameters": {...}} ("arguments" also read), or several joined
//                by ';' (Llama 3.1 and 3.2 with custom tools); other text is content.
// A call that does not parse is never dropped silently and never a crash: it is reported as a
// parse error with the turn (ParsedTurn::error), the calls before it kept.
//
// Thread-safety: pure functions.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "prl/v1/environment.pb.h"
#include "tokenizer/text_codec.h"

namespace prl::episode {

enum class ToolCallFormat { kNone, kHermes, kLlama3Json };

// "none", "hermes", "llama3_json".
absl::string_view ToolCallFormatName(ToolCallFormat format);
// The format named (EnvironmentSpec.tool_call_format); "" reads it from the codec's chat
// template (DetectToolCallFormat). An unknown name is InvalidArgument naming `field`.
absl::StatusOr<ToolCallFormat> ToolCallFormatOf(absl::string_view name,
                                                const tokenizer::TextCodec& codec,
                                                absl::string_view field);
// hermes when the template writes <tool_call>, llama3_json when it writes <|python_tag|> or
// asks for {"name": ..., "parameters": ...}; else none.
ToolCallFormat DetectToolCallFormat(const tokenizer::TextCodec& codec);

struct ParsedTurn {
  std::string content;                   // the turn's text without its calls, trimmed
  std::vector<prl::v1::ToolCall> calls;  // in order; ids "call_" + 16 hex digits
  std::string error;                     // the first call that did not parse, and why
};

// A call as the model family writes it (what ParseToolCalls reads back): hermes
// `<tool_call>\n{"name": NAME, "arguments": ARGS}\n</tool_call>`, llama3_json
// `{"name": NAME, "parameters": ARGS}`; "" for none. `arguments_json`: a JSON object.
std::string WriteToolCall(ToolCallFormat format, const std::string& name,
                          const std::string& arguments_json);

// `id_seed` (e.g. "<episode id>/<turn>") makes the calls' ids, the same on every retry.
ParsedTurn ParseToolCalls(ToolCallFormat format, absl::string_view text, absl::string_view id_seed);

}  // namespace prl::episode
