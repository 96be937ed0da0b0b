// The built-in calculator tool environment (docs/environments.md): the model may call a
// calculator inside a turn, e.g. "<calc>734*58</calc>", and gets the result back as a tool
// message ("42572"); a turn without a call is its final answer, scored against the prompt's
// reference (an integer): episode reward 1 if the answer's last integer equals it, else 0.
// Multi-digit multiplication is out of a tiny model's reach without the tool.
//
// Parameters (the prompt set's environment parameters): call_open (default "<calc>") and
// call_close (default "</calc>", the episode's stop string): the call syntax, so that a model
// with a small vocabulary (the built-in character tokenizer has no letters) can use e.g. "("
// and ")=". A turn that ends with call_close after a call_open is a call of the expression
// between them; any other turn is the answer. An episode truncated by a limit scores 0.
//
// Long tool outputs (parameter output_chars N, 0 to kMaxOutputChars; default 0: the result
// alone): real tools print logs, and an agent's episode grows with them. With N > 0 a call that
// evaluates is answered by exactly N characters (or the result alone when it is longer): the
// evaluation's trace (ToolReply), repeated as often as it fits whole, spaces, then the result,
// so that the result is still the reply's last integer. Only digits, the expression's
// operators, '=', space and newline: the character tokenizer reads it. Errors stay unpadded.
//
// Tool calls (parameter tool_name, e.g. "calculator"; docs/environments.md "Tool calls"): the
// calculator is offered as an OpenAI function tool of that name (CalculatorTools: one string
// argument "expression"), rendered into the prompt by the chat template; a turn's structured
// calls (StepRequest.tool_calls, parsed in the model's format) are answered with tool messages
// carrying each call's id; a turn without calls is the answer. No stop strings then: the turn
// ends where the model ends it. call_open and call_close are not used.
//
// Expressions (EvaluateExpression): integers, + - * /, unary minus and parentheses, in int64;
// "/" divides exactly (a remainder is an error, as is division by zero or an overflow); at most
// 256 characters and 32 levels of parentheses. An error is answered as the tool's message
// ("error: division by zero"), not as a failure of the episode.
//
// Thread-safety: CalculatorEnvironment may be called from many threads (env/episode_table.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "env/environment.h"
#include "env/episode_table.h"

namespace prl::env {

// The call syntax's defaults (parameters call_open and call_close).
inline constexpr char kDefaultCallOpen[] = "<calc>", kDefaultCallClose[] = "</calc>";
// The longest tool reply output_chars asks for (characters).
inline constexpr int64_t kMaxOutputChars = 65536;

// The calculator as a function tool named `name`, a JSON array of one OpenAI tool (what
// StartEpisodeResponse.tools_json carries; examples/openai_agent offers the same):
// [{"type": "function", "function": {"name": NAME, "description": "Evaluates an arithmetic
// expression of integers with + - * / and parentheses.", "parameters": {"type": "object",
// "properties": {"expression": {"type": "string"}}, "required": ["expression"]}}}]
std::string CalculatorTools(const std::string& name);

// `trace` (optional) receives one line per operation in evaluation order ("734*58=42572"), a
// multiplication by a positive number of two or more digits preceded by its partial products
// ("734*8=5872", "734*50=36700").
absl::StatusOr<int64_t> EvaluateExpression(absl::string_view expression,
                                           std::vector<std::string>* trace = nullptr);

// The tool's reply to a call of `expression`: the result, or "error: ..."; with output_chars
// > 0 the padded trace described above (output_chars characters ending with the result).
std::string ToolReply(absl::string_view expression, int64_t output_chars);

// The last integer in `text` (an optional '-' and digits), if any.
bool LastInteger(absl::string_view text, int64_t* value);

class CalculatorEnvironment final : public Environment {
 public:
  absl::StatusOr<v1::StartEpisodeResponse> StartEpisode(
      const v1::StartEpisodeRequest& request) override;
  absl::StatusOr<v1::StepResponse> Step(const v1::StepRequest& request) override;
  absl::StatusOr<v1::EndEpisodeResponse> EndEpisode(const v1::EndEpisodeRequest& request) override;

 private:
  struct State {
    int64_t answer = 0;
    std::string call_open, call_close;
    std::string tool_name;  // tool calls: the function's name ("" the call syntax)
    int64_t output_chars = 0;  // a reply's length (0: the result alone)
    int64_t calls = 0;
  };
  EpisodeTable<State> episodes_;
};

}  // namespace prl::env
