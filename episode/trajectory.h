// An agent's calls as token sequences (docs/agents.md, "How records are built"): what a call to
// the OpenAI-compatible endpoint adds to its episode's trajectory, and what its answer says.
//
// A trajectory is one token sequence in the engine, its KV cache kept between calls: the first
// call's prompt, then each answer as sampled, each later call's new messages rendered as a
// delta (episode/turn_renderer.h: never the conversation again), and so on. A call continues
// the open trajectory when
//   chat         its messages are the trajectory's messages (the earlier calls' messages and
//                the answers as the endpoint gave them: SameMessage) followed by new messages
//                that are not the assistant's (tool results, user or system messages), with the
//                same tools;
//   completions  its prompt (text, or token ids) begins with the trajectory's text (prompts
//                and answers as given), or its token ids.
// Any other call — the agent dropped, edited or reordered messages, changed the tools, or wrote
// an assistant message of its own — starts a new trajectory from its whole prompt: the episode
// becomes one more record (the split is named, and counted by the caller).
//
// Answers: the model's text (a forced tool choice's opening first) is cut at the call's first
// stop string; a <think> block the answer opens with becomes reasoning_content; with tools (tool_choice not none) the
// tool calls are parsed in the model's format (episode/tool_calls.h), and one that does not
// parse leaves the text as content. finish_reason: "length" when the budget ended the answer,
// else "tool_calls" when it made calls, else "stop".
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "episode/tool_calls.h"
#include "nlohmann/json.hpp"
#include "openai/chat_request.h"
#include "prl/v1/environment.pb.h"
#include "tokenizer/text_codec.h"

namespace prl::episode {

struct Trajectory {
  bool chat = true;
  // chat: the conversation so far, the last answer included, as ParseChatRequest normalises
  // messages; the tools it is rendered with (null: none).
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  nlohmann::ordered_json tools;
  // completions: the prompts and answers so far as the agent sees them (text), or the
  // sequence's token ids (a prompt of ids).
  bool by_ids = false;
  std::string text;
  std::vector<int32_t> ids;
  int32_t last_token = -1;  // the sequence's last token (-1: none)
};

// How a call starts: continuing `open` (tokens: its new messages rendered as a delta), or a new
// trajectory (tokens: its whole prompt; `split` says why `open` could not go on, "" when there
// was none).
struct CallPrompt {
  bool continues = false;
  std::vector<int32_t> tokens;
  std::string split;
  Trajectory next;  // the trajectory with the call's prompt (before its answer)
};

// `kwargs`: the template variables (the prompt set's chat's). Errors: the call cannot be
// rendered (InvalidArgument naming the messages: e.g. no chat template for a chat call).
absl::StatusOr<CallPrompt> StartCall(const tokenizer::TextCodec& codec, const Trajectory* open,
                                    const openai::ChatCall& call,
                                    const nlohmann::ordered_json& kwargs);

// Whether two normalised messages say the same (role, content, name, tool_call_id, tool calls
// with their ids, names and arguments as JSON); an assistant's reasoning_content is not compared
// (SDKs drop it).
bool SameMessage(const nlohmann::ordered_json& a, const nlohmann::ordered_json& b);

// The text a forced tool choice opens the answer with (context: never sampled, never trained):
// "required" the format's call opening, a function the opening with its name; "" otherwise.
std::string ForcedOpening(ToolCallFormat format, const openai::ChatCall& call);

struct AnswerText {
  std::string content;
  std::string reasoning;
  std::vector<prl::v1::ToolCall> tool_calls;
  std::string finish_reason;  // stop, length, tool_calls
};

// `text`: the forced opening and the decoded answer; `by_length`: the budget ended it; `id_seed`
// makes the calls' ids ("<episode id>/<call>").
AnswerText ReadAnswer(absl::string_view text, const openai::ChatCall& call, ToolCallFormat format,
                      bool by_length, absl::string_view id_seed);

// What of a partial answer may be streamed: a prefix of ReadAnswer's content whatever the rest
// of the answer turns out to be (nothing of a think block, of a tool call, of a possible stop
// string's start, or of trailing whitespace).
std::string VisibleContent(absl::string_view text, const openai::ChatCall& call,
                           ToolCallFormat format);

// The trajectory after the call's answer: `start.next` with the answer appended (chat: as the
// assistant's message the agent will send back; completions: its text, or `answer_tokens` —
// what the answer added to the sequence — after the prompt's ids).
Trajectory Answered(const CallPrompt& start, const AnswerText& answer,
                    absl::Span<const int32_t> answer_tokens);

}  // namespace prl::episode
