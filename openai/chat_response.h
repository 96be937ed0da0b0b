// The answers of prl's OpenAI-compatible endpoint (docs/agents.md), in OpenAI's schema: a chat
// completion (`choices[0].message` with `content` and `tool_calls`, `finish_reason` stop |
// length | tool_calls, `usage`), a text completion, the chunks of a streamed one (server-sent
// events), the model list, and errors ({"error": {"message", "type", "param", "code"}}). Every
// completion also carries what an RL trainer needs and OpenAI has no field for, under "prl":
// the exact token ids, their behaviour log-probs (of the distribution actually sampled:
// temperature, top-p and top-k applied; 0 for a context token the model did not sample), the
// weight version of each, which of them the model sampled, and the prompt's token count.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "nlohmann/json.hpp"
#include "prl/v1/environment.pb.h"

namespace prl::openai {

// What one call generated, as the endpoint reports it.
struct Completion {
  bool chat = true;     // false: a text completion
  std::string id;       // "chatcmpl-..." / "cmpl-..."
  std::string model;    // the served model's name
  int64_t created = 0;  // unix seconds
  std::string content;  // the text outside tool calls (chat), or the whole text (completions)
  std::string reasoning_content;  // a <think> block's text, when the model wrote one
  std::vector<prl::v1::ToolCall> tool_calls;
  std::string finish_reason;  // "stop", "length", "tool_calls"
  int64_t prompt_tokens = 0;  // the context the call continued (its whole trajectory so far)
  // The completion as generated (context tokens such as a forced tool-call prefix included),
  // one entry per token.
  std::vector<int32_t> token_ids;
  std::vector<float> logprobs;
  std::vector<int64_t> versions;
  std::vector<uint8_t> sources;  // 0 sampled by the model, 1 context
  // With logprobs: the text of each sampled token — the last token_texts.size() entries of
  // token_ids (a forced opening before them is not listed) — and up to top_logprobs
  // alternatives (text, log-prob).
  bool with_logprobs = false;
  std::vector<std::string> token_texts;
  std::vector<std::vector<std::pair<std::string, float>>> top_logprobs;
};

nlohmann::ordered_json CompletionJson(const Completion& c);

// Streaming: the first chunk (a chat's role), a chunk of new text, the last chunk (tool calls,
// the finish reason, logprobs and the "prl" fields), and the usage chunk; each sent as Event.
nlohmann::ordered_json FirstChunkJson(const Completion& c);
nlohmann::ordered_json TextChunkJson(const Completion& c, const std::string& text);
nlohmann::ordered_json LastChunkJson(const Completion& c);
nlohmann::ordered_json UsageChunkJson(const Completion& c);
// "data: <json>\n\n"; Done() is "data: [DONE]\n\n".
std::string Event(const nlohmann::ordered_json& chunk);
std::string Done();
// JSON text; bytes that are not UTF-8 (a token cut inside a character) become U+FFFD.
std::string Dump(const nlohmann::ordered_json& json);

nlohmann::ordered_json ModelsJson(const std::string& model, int64_t created);
// type: "invalid_request_error" (400), "authentication_error" (401), "not_found_error" (404),
// "server_error" (500), ...; param: the field to blame, when one is ("" none).
nlohmann::ordered_json ErrorJson(const std::string& message, const std::string& type,
                                 const std::string& param = "");

}  // namespace prl::openai
