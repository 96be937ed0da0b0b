#include "coordinator/capacity.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"

namespace prl::coordinator {

namespace {

// A 0 limit is no limit.
int64_t Limit(int64_t limit) { return limit > 0 ? limit : std::numeric_limits<int64_t>::max(); }

std::string Largest(int64_t limit) {
  return limit == std::numeric_limits<int64_t>::max() ? std::string("unlimited")
                                                      : absl::StrCat(limit);
}

}  // namespace

bool Fits(const prl::v1::ActorCapacity& capacity, const GroupShape& group) {
  return group.samples <= Limit(capacity.max_samples_per_prompt()) &&
         group.tokens <= Limit(capacity.max_tokens());
}

std::string NoActorFits(absl::Span<const prl::v1::ActorCapacity* const> actors,
                        const GroupShape& group) {
  int64_t most_samples = 0, most_tokens = 0;  // the tokens among actors with enough samples
  for (const prl::v1::ActorCapacity* actor : actors) {
    const prl::v1::ActorCapacity& capacity = *actor;
    if (Fits(capacity, group)) return "";
    most_samples = std::max(most_samples, Limit(capacity.max_samples_per_prompt()));
    if (group.samples <= Limit(capacity.max_samples_per_prompt())) {
      most_tokens = std::max(most_tokens, Limit(capacity.max_tokens()));
    }
  }
  if (actors.empty()) return "";
  if (most_samples < group.samples) {
    return absl::StrCat("no registered actor can run samples_per_prompt ", group.samples,
                        " (largest: ", Largest(most_samples), ")");
  }
  return absl::StrCat(
      "no registered actor can run ", group.tokens,
      " tokens per sequence (prompt + sampling.max_tokens; largest: ", Largest(most_tokens), ")");
}

}  // namespace prl::coordinator
