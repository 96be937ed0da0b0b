// libFuzzer target for tool calls in a model's own format (episode/tool_calls.h): the bytes as a
// model turn's text, parsed as hermes and as llama3_json, as an environment episode does with
// what the model wrote.
//
// Beyond "no crash, no sanitizer report, no hang", every parsed call has an id "call_" and 16
// hex digits, a non-empty name and arguments_json that parses as a JSON object; and the call
// written back in the same format (WriteToolCall, what a demonstration's assistant turn
// renders) parses to one call with the same name and the same arguments, without error or
// content. The same entry point replays fuzz/corpus/tool_calls in ctest.
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "absl/strings/match.h"
#include "core/json_input.h"
#include "episode/tool_calls.h"

namespace {

using prl::episode::ToolCallFormat;

nlohmann::ordered_json ObjectOf(const std::string& arguments_json) {
  absl::StatusOr<nlohmann::ordered_json> parsed = prl::ParseJsonInput(arguments_json, "arguments");
  if (!parsed.ok() || !parsed->is_object()) std::abort();
  return *std::move(parsed);
}

void Check(ToolCallFormat format, absl::string_view text) {
  const prl::episode::ParsedTurn turn = prl::episode::ParseToolCalls(format, text, "episode/3");
  for (const prl::v1::ToolCall& call : turn.calls) {
    if (call.id().size() != 21 || !absl::StartsWith(call.id(), "call_") ||
        call.id().find_first_not_of("0123456789abcdef", 5) != std::string::npos ||
        call.name().empty()) {
      std::abort();
    }
    const nlohmann::ordered_json arguments = ObjectOf(call.arguments_json());
    const std::string written =
        prl::episode::WriteToolCall(format, call.name(), call.arguments_json());
    const prl::episode::ParsedTurn again = prl::episode::ParseToolCalls(format, written, "again");
    if (!again.error.empty() || !again.content.empty() || again.calls.size() != 1 ||
        again.calls[0].name() != call.name() ||
        ObjectOf(again.calls[0].arguments_json()) != arguments) {
      std::fprintf(stderr, "%s call written as\n%s\nreads back with error '%s', %zu calls\n",
                   std::string(prl::episode::ToolCallFormatName(format)).c_str(), written.c_str(),
                   again.error.c_str(), again.calls.size());
      std::abort();
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view text(reinterpret_cast<const char*>(data), size);
  Check(ToolCallFormat::kHermes, text);
  Check(ToolCallFormat::kLlama3Json, text);
  return 0;
}
