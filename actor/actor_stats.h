// ActorStats: what an actor has done, for `prl actor`'s summary and tests; ActorStatsBoard: the
// one copy the actor's parts update (each part counts its own events) and anyone reads.
//
// Thread-safety: ActorStatsBoard may be used from any thread.
#pragma once

#include <cstdint>
#include <mutex>

namespace prl::actor {

struct ActorStats {
  int64_t groups_written = 0, samples_written = 0, tokens_generated = 0;
  int64_t reward_failures = 0, duplicate_completions = 0;
  // Groups refused because their prompt's lease was no longer this actor's (it expired and
  // was re-leased, or the coordinator restarted): the prompt is re-run, the group dropped.
  int64_t lost_leases = 0;
  int64_t weight_version = 0, weight_swaps = 0;
  int64_t registrations = 0;
  int64_t groups_generated = 0;  // groups the engine finished (scored and written or not)
  int64_t eval_groups = 0;       // of evaluation sets: scored and completed, never written
  int64_t leases_released = 0;   // given back to the coordinator (engine refusal, reward failure)
};

class ActorStatsBoard {
 public:
  template <typename Fn>
  void Update(Fn&& update) {
    std::lock_guard<std::mutex> lock(mu_);
    update(stats_);
  }
  ActorStats Get() const {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
  }

 private:
  mutable std::mutex mu_;
  ActorStats stats_;
};

}  // namespace prl::actor
