// The requests of prl's OpenAI-compatible endpoint (docs/agents.md), parsed and checked: the
// body of POST /v1/chat/completions and of POST /v1/completions as a ChatCall. A malformed
// request is InvalidArgument naming the field, the expected and the found value (the endpoint
// answers 400 with it), e.g. `messages[2].tool_calls[0].function.arguments: expected a string
// of JSON, found 3`; every list and string is bounded (ChatLimits).
//
// What is read, as OpenAI defines it:
//   chat         messages (role system|developer|user|assistant|tool; content a string or an
//                array of {"type": "text", "text"} parts; an assistant's reasoning_content (kept
//                for the template) and tool_calls
//                [{id, type: "function", function: {name, arguments}}]; a tool message's
//                tool_call_id and name), tools ([{type: "function", function: {name,
//                description, parameters}}]), tool_choice ("auto", "none", "required", or
//                {"type": "function", "function": {"name"}}), temperature [0, 2], top_p (0, 1],
//                max_tokens or max_completion_tokens, stop (a string or up to 4), seed,
//                logprobs, top_logprobs [0, 20], stream, stream_options.include_usage, n (1),
//                model (any: the actor serves its one model), user (ignored);
//   completions  prompt (a string, or token ids), and the same sampling fields (logprobs: an
//                integer of top alternatives, as the legacy API has it).
// Unknown fields are refused naming them (a client that asks for what is not done is told); a
// message's fields that an SDK sends back with an answer it got (refusal, annotations,
// function_call when null) are accepted and ignored.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace prl::openai {

struct ChatLimits {
  int max_messages = 1024;
  int max_tools = 128;
  size_t max_string_bytes = size_t{1} << 20;  // one message's content, a tool's schema
  int max_stops = 4;
  size_t max_stop_bytes = 64;
};

enum class ToolChoice { kAuto, kNone, kRequired, kFunction };

struct ChatCall {
  bool chat = true;  // false: /v1/completions
  // chat: the conversation, normalised: role, content (a string), and an assistant's tool_calls
  // (function.arguments kept as the JSON text given), a tool message's tool_call_id and name.
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  nlohmann::ordered_json tools;  // null: none
  ToolChoice tool_choice = ToolChoice::kAuto;
  std::string tool_choice_function;  // kFunction: its name
  // completions: the prompt as text, or as token ids.
  std::string prompt_text;
  std::vector<int32_t> prompt_ids;
  // Sampling; unset: the prompt set's (docs/agents.md).
  std::optional<float> temperature;
  std::optional<float> top_p;
  int32_t max_tokens = 0;  // 0: what the episode's budget and the context leave
  std::vector<std::string> stop;
  std::optional<uint64_t> seed;
  bool logprobs = false;
  int32_t top_logprobs = 0;  // alternatives per token, 0 to 20
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  std::string model;
};

// The endpoint's entry points: a body's bytes, parsed bounded (core/json_input.h: at most 64
// deep), then checked as below. A wrong member type is a 400 naming the field, never a throw.
absl::StatusOr<ChatCall> ParseChatRequestBody(absl::string_view body,
                                              const ChatLimits& limits = {});
absl::StatusOr<ChatCall> ParseCompletionRequestBody(absl::string_view body,
                                                    const ChatLimits& limits = {});

absl::StatusOr<ChatCall> ParseChatRequest(const nlohmann::ordered_json& body,
                                          const ChatLimits& limits = {});
absl::StatusOr<ChatCall> ParseCompletionRequest(const nlohmann::ordered_json& body,
                                                const ChatLimits& limits = {});

}  // namespace prl::openai
