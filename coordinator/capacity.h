// Actor capacity: the largest group an actor can run (prl.v1.ActorCapacity, declared at
// registration), and which prompts fit it. The coordinator leases an actor only prompts that
// fit, and a prompt set that fits no registered actor says so in its status.
#pragma once

#include <cstdint>
#include <string>

#include "absl/types/span.h"
#include "prl/v1/prompt.pb.h"

namespace prl::coordinator {

// A group of `samples` sequences of up to `tokens` tokens each (prompt + sampling.max_tokens).
struct GroupShape {
  int32_t samples = 0;
  int64_t tokens = 0;
};

// Whether an actor of `capacity` can run the group (a 0 limit is no limit).
bool Fits(const prl::v1::ActorCapacity& capacity, const GroupShape& group);

// "" when one of `actors` can run the group (it stops at the first), or when there are none
// (nobody to ask yet); else why not, naming the largest capacity, e.g. "no registered actor can
// run samples_per_prompt 128 (largest: 64)".
std::string NoActorFits(absl::Span<const prl::v1::ActorCapacity* const> actors,
                        const GroupShape& group);

}  // namespace prl::coordinator
