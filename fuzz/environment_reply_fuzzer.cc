// libFuzzer target for an environment's answers (env/episode_protocol.h): the bytes as the
// protobuf of a StepResponse, a StartEpisodeResponse and an EndEpisodeResponse, as a remote
// environment's server sends them; a valid StartEpisodeResponse's tools_json then joins a chat
// prompt's tools (episode/turn_renderer.h's WithTools). Bytes that are no such protobuf are
// dropped, as gRPC drops them.
//
// Beyond "no crash, no sanitizer report, no hang", an error names the answer's field; an
// accepted answer keeps the header's promises (at most kMaxMessages messages, roles user, tool
// or system, content within kMaxMessageBytes, finite rewards, at most kMaxStopStrings non-empty
// stop strings); WithTools gives the prompt's tools followed by the environment's, all objects,
// or an error naming StartEpisodeResponse.tools_json. The same entry point replays
// fuzz/corpus/environment_reply in ctest.
#include <cmath>
#include <cstdint>
#include <cstdlib>

#include "absl/strings/match.h"
#include "env/episode_protocol.h"
#include "episode/turn_renderer.h"

namespace {

using prl::episode::ChatContext;

// Errors explain themselves, naming the answer's field.
void CheckError(const absl::Status& status, absl::string_view message) {
  if (!status.ok() && !absl::StartsWith(status.message(), message)) std::abort();
}

void CheckMessages(const google::protobuf::RepeatedPtrField<prl::v1::EnvMessage>& messages) {
  if (messages.size() > prl::env::kMaxMessages) std::abort();
  for (const prl::v1::EnvMessage& m : messages) {
    if (m.role() != "user" && m.role() != "tool" && m.role() != "system") std::abort();
    if (m.content().size() > prl::env::kMaxMessageBytes) std::abort();
  }
}

void CheckTools(const prl::v1::StartEpisodeResponse& start) {
  ChatContext prompt;  // a chat prompt that brought a tool of its own
  prompt.tools =
      nlohmann::ordered_json::parse(R"([{"type": "function", "function": {"name": "p"}}])");
  const absl::StatusOr<ChatContext> context = prl::episode::WithTools(prompt, start.tools_json());
  if (!context.ok()) {
    if (context.status().message().find("StartEpisodeResponse.tools_json") == std::string::npos) {
      std::abort();
    }
    return;
  }
  if (!context->tools.is_array() || context->tools.empty() ||
      context->tools[0] != prompt.tools[0]) {
    std::abort();
  }
  for (const auto& tool : context->tools) {
    if (!tool.is_object()) std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const int n = static_cast<int>(size);
  prl::v1::StepResponse step;
  if (step.ParseFromArray(data, n)) {
    const absl::Status valid = prl::env::ValidateStepResponse(step);
    CheckError(valid, "StepResponse.");
    if (valid.ok()) {
      CheckMessages(step.messages());
      if (!std::isfinite(step.turn_reward())) std::abort();
      if (step.done() && !std::isfinite(step.episode_reward())) std::abort();
    }
  }
  prl::v1::StartEpisodeResponse start;
  if (start.ParseFromArray(data, n)) {
    const absl::Status valid = prl::env::ValidateStartResponse(start);
    CheckError(valid, "StartEpisodeResponse.");
    if (valid.ok()) {
      CheckMessages(start.observation());
      if (start.stop_strings_size() > prl::env::kMaxStopStrings) std::abort();
      for (const std::string& stop : start.stop_strings()) {
        if (stop.empty() || stop.size() > prl::env::kMaxStopStringBytes) std::abort();
      }
      CheckTools(start);
    }
  }
  prl::v1::EndEpisodeResponse end;
  if (end.ParseFromArray(data, n)) {
    const absl::Status valid = prl::env::ValidateEndResponse(end);
    CheckError(valid, "EndEpisodeResponse.");
    if (valid.ok() && !std::isfinite(end.episode_reward())) std::abort();
  }
  return 0;
}
