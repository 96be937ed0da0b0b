// libFuzzer target for the OpenAI-compatible endpoint's request parser (openai/chat_request.h):
// the bytes are an HTTP body of POST /v1/chat/completions and of POST /v1/completions, each
// parsed with the default limits and with tight ones.
//
// Beyond "no crash, no sanitizer report, no hang" (no throw: a wrong member type is a 400), an
// error has a message (the 400's text); an accepted chat has a non-empty array of messages,
// each an object with a known role and a string content; a completion has its prompt as text
// or as ids in [0, 2^31); and limits are monotone: what the tight limits accept, the default
// ones accept too. The same entry point replays fuzz/corpus/chat_request in ctest.
#include <cstdint>
#include <cstdlib>

#include "openai/chat_request.h"

namespace {

using prl::openai::ChatCall;
using prl::openai::ChatLimits;

constexpr ChatLimits kTight = {
    .max_messages = 2, .max_tools = 1, .max_string_bytes = 64, .max_stops = 2, .max_stop_bytes = 8};

void CheckCall(const absl::StatusOr<ChatCall>& call, bool chat) {
  if (!call.ok()) {
    if (call.status().message().empty()) std::abort();  // errors must explain themselves
    return;
  }
  if (call->chat != chat || call->stop.size() > 4 || call->top_logprobs < 0 ||
      call->top_logprobs > 20 || call->max_tokens < 0 || call->max_tokens > (1 << 20)) {
    std::abort();
  }
  if (!chat) {
    for (const int32_t id : call->prompt_ids) {
      if (id < 0) std::abort();
    }
    return;
  }
  if (!call->messages.is_array() || call->messages.empty()) std::abort();
  for (const auto& m : call->messages) {
    if (!m.is_object() || !m["role"].is_string() || !m["content"].is_string()) std::abort();
    const std::string& role = m["role"].get_ref<const std::string&>();
    if (role != "system" && role != "user" && role != "assistant" && role != "tool") std::abort();
  }
  if (!call->tools.is_null() && (!call->tools.is_array() || call->tools.empty())) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view body(reinterpret_cast<const char*>(data), size);
  for (const bool chat : {true, false}) {
    const auto parse =
        chat ? prl::openai::ParseChatRequestBody : prl::openai::ParseCompletionRequestBody;
    const absl::StatusOr<ChatCall> normal = parse(body, ChatLimits{});
    const absl::StatusOr<ChatCall> tight = parse(body, kTight);
    CheckCall(normal, chat);
    CheckCall(tight, chat);
    if (tight.ok() && !normal.ok()) std::abort();
  }
  return 0;
}
