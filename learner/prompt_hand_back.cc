#include "learner/prompt_hand_back.h"

#include <cstdio>
#include <utility>

#include "absl/time/clock.h"

namespace prl::learner {

void PromptHandBack::Hold(const LeasedGroup& group, StalePrompt prompt, bool quarantined) {
  for (Held& held : held_) {
    if (held.group.group_key == group.group_key) {  // its lease expired while held:
      held.group = group;                           // acknowledge it under the new one
      return;
    }
  }
  held_.push_back({group, std::move(prompt), quarantined});
}

void PromptHandBack::Offer() {
  if (absl::Now() - last_offer_ < retry_) return;
  // The prompts of groups the buffer dropped for room (replay.drop_oldest) go back too.
  uint64_t dropped_through = 0;
  const std::vector<DroppedPrompt> dropped =
      buffer_->DroppedPrompts(kMaxDroppedPerOffer, &dropped_through);
  if (held_.empty() && dropped.empty()) return;
  last_offer_ = absl::Now();
  std::vector<StalePrompt> prompts;
  for (const Held& held : held_) prompts.push_back(held.prompt);
  for (const DroppedPrompt& d : dropped) {
    prompts.push_back({d.prompt_set_id, d.prompt_index,
                       "dropped by the replay buffer, full before the learner took the group "
                       "(replay.drop_oldest)"});
  }
  const absl::Status reopened = reopen_(prompts);
  if (!reopened.ok()) {  // the coordinator is away: kept, and offered again later
    if (absl::Now() - last_warning_ >= absl::Seconds(30)) {  // said once per 30 s
      last_warning_ = absl::Now();
      std::fprintf(stderr, "learner: %zu prompts not yet handed back: %s\n", prompts.size(),
                   std::string(reopened.message()).c_str());
    }
    return;
  }
  int64_t quarantined = 0;
  for (const Held& held : held_) {
    buffer_->Ack(held.group).IgnoreError();
    ++(held.quarantined ? quarantined : stale_requeued_);
  }
  held_.clear();
  buffer_->ForgetDroppedPrompts(dropped_through);
  dropped_requeued_ += static_cast<int64_t>(dropped.size());
  if (quarantined > 0) {
    quarantined_requeued_ += quarantined;
    std::fprintf(stderr,
                 "learner: %lld prompts of quarantined groups handed back to be generated again "
                 "(%lld so far)\n",
                 static_cast<long long>(quarantined),
                 static_cast<long long>(quarantined_requeued_));
  }
}

}  // namespace prl::learner
