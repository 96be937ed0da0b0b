// libFuzzer target for an agent's answer (env/remote_agent.h's ValidateRunEpisodeResponse): the
// bytes as the protobuf of a RunEpisodeResponse, as a user's agent service sends it, checked
// against the calls the actor served in the episode: none, one, as many as the answer has call
// rewards, and AgentSpec.max_calls' default (16). Bytes that are no such protobuf are dropped,
// as gRPC drops them.
//
// Beyond "no crash, no sanitizer report, no hang", an error has a message naming
// RunEpisodeResponse, and an accepted answer keeps the header's promise: a finite reward, call
// rewards none or one per served call, each finite, a done_reason of at most 256 bytes. The same
// entry point replays fuzz/corpus/agent_reply in ctest.
#include <cmath>
#include <cstdint>
#include <cstdlib>

#include "env/remote_agent.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  prl::v1::RunEpisodeResponse response;
  if (!response.ParseFromArray(data, static_cast<int>(size))) return 0;
  for (const int32_t calls : {0, 1, response.call_rewards_size(), 16}) {
    const absl::Status valid = prl::env::ValidateRunEpisodeResponse(response, calls);
    if (!valid.ok()) {
      if (valid.message().find("RunEpisodeResponse.") != 0) std::abort();
      continue;
    }
    if (!std::isfinite(response.reward()) || response.done_reason().size() > 256) std::abort();
    if (response.call_rewards_size() != 0 && response.call_rewards_size() != calls) std::abort();
    for (const double reward : response.call_rewards()) {
      if (!std::isfinite(reward)) std::abort();
    }
  }
  return 0;
}
