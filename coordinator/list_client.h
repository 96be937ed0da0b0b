// The client side of ListPromptSets' pages: every prompt set of a coordinator, in submission
// order (`prl status`, prl run's prompt feeder).
#pragma once

#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "prl/v1/prompt.grpc.pb.h"

namespace prl::coordinator {

// Each page gets `timeout`.
absl::StatusOr<std::vector<prl::v1::PromptSetStatus>> ListAllPromptSets(
    prl::v1::PromptService::Stub& stub, absl::Duration timeout);

}  // namespace prl::coordinator
