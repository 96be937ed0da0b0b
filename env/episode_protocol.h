// The checks an environment's answers must pass before an episode uses them
// (proto/prl/v1/environment.proto): a malformed answer fails the episode's attempt with an error
// naming the field, the expected and the found value, never a crash or a silent repair.
//
// Thread-safety: pure functions.
#pragma once

#include "absl/status/status.h"
#include "prl/v1/environment.pb.h"

namespace prl::env {

inline constexpr int kMaxStopStrings = 8;
inline constexpr size_t kMaxStopStringBytes = 64;
inline constexpr size_t kMaxMessageBytes = size_t{1} << 20;  // one message's content
inline constexpr int kMaxMessages = 64;                      // per answer
inline constexpr size_t kMaxToolsBytes = size_t{256} << 10;  // StartEpisodeResponse.tools_json

// Messages: role "user", "tool" or "system", content valid UTF-8 of at most kMaxMessageBytes.
absl::Status ValidateStartResponse(const v1::StartEpisodeResponse& response);
// Messages as above; a finite turn reward; when done, a finite episode reward.
absl::Status ValidateStepResponse(const v1::StepResponse& response);
absl::Status ValidateEndResponse(const v1::EndEpisodeResponse& response);

}  // namespace prl::env
