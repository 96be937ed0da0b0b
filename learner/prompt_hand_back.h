// PromptHandBack: the groups the learner will not train whose prompts go back to the
// coordinator to be generated again (ActorControl.ReopenPrompts): stale ones (older than
// learner.max_lag), quarantined ones (replay/quarantine.h), and those the replay buffer
// dropped for room (replay.drop_oldest: ReplayBuffer::DroppedPrompts, forgotten there once
// the coordinator took them). A group is held until the
// coordinator took its prompt, then acknowledged out of the replay buffer, so that a learner
// that dies meanwhile leaves it to be delivered again and nothing is lost. Offers are
// rate-limited (`retry`); while the coordinator is away the learner says so once per 30 s.
//
// Rank 0 of the learner only; not for concurrent use.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "replay/replay_buffer.h"

namespace prl::learner {

struct StalePrompt {
  std::string prompt_set_id;
  uint64_t prompt_index = 0;
  std::string reason;
};

class PromptHandBack {
 public:
  using Reopen = std::function<absl::Status(const std::vector<StalePrompt>&)>;

  // `buffer` (which must outlive this) acknowledges the groups once their prompts were taken.
  PromptHandBack(ReplayBuffer* buffer, Reopen reopen, absl::Duration retry)
      : buffer_(buffer), reopen_(std::move(reopen)), retry_(retry) {}

  // Holds `group` until `prompt` was taken back (once per group key: a group delivered again
  // after its lease expired while held replaces the held one).
  void Hold(const LeasedGroup& group, StalePrompt prompt, bool quarantined);
  // Offers the held prompts (at most once per `retry`) and acknowledges their groups once the
  // coordinator took them.
  void Offer();

  // Prompts taken back so far: of stale groups, of quarantined ones.
  int64_t stale_requeued() const { return stale_requeued_; }
  int64_t quarantined_requeued() const { return quarantined_requeued_; }
  int64_t dropped_requeued() const { return dropped_requeued_; }  // of dropped groups

 private:
  struct Held {
    LeasedGroup group;
    StalePrompt prompt;
    bool quarantined = false;
  };
  ReplayBuffer* buffer_;
  Reopen reopen_;
  absl::Duration retry_;
  std::vector<Held> held_;
  absl::Time last_offer_ = absl::InfinitePast(), last_warning_ = absl::InfinitePast();
  int64_t stale_requeued_ = 0, quarantined_requeued_ = 0, dropped_requeued_ = 0;
  static constexpr size_t kMaxDroppedPerOffer = 1024;
};

}  // namespace prl::learner
