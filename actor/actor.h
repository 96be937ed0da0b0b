// Actor: one actor server. It registers with the coordinator, leases prompts, generates each
// prompt's group with the paged KV-cache engine, scores the samples, writes the group to the
// replay buffer, and reports it done; between two engine steps it swaps in the newest weights
// the broadcaster delivered (generation never waits for them).
//
// The actor is a thin owner of parts that own their state, one thread each where they run:
//   actor/lease_book.h        the leases held, the releases queued, and the hand-offs between
//                             the threads (granted prompts, generated groups)
//   actor/coordinator_link.h  the control thread's calls: register, heartbeat, lease, release,
//                             and the finisher's completions
//   actor/engine_driver.h     the engine loop (Run's thread): swaps, prompts into the engine,
//                             steps, finished groups out
//   actor/group_finisher.h    the finisher thread: score, write to the replay buffer, complete
//
// A slow reward, a full replay buffer or a slow coordinator therefore never pauses generation,
// and never stops the heartbeats that renew the leases being waited on (backpressure renews
// leases instead of losing them). A lease counts against max_prompts_in_flight from the moment
// it is granted until its group is completed or dropped. Heartbeats and leases share one
// thread, so a heartbeat lists exactly the leases held at that moment, and a group dropped
// (lost lease) leaves that list at once: the coordinator re-queues its prompt at the next
// heartbeat instead of when the lease expires. A group the actor gives up on (its engine
// refuses it, its reward fails) is released with its reason; the coordinator counts either as
// a failed attempt of the prompt and fails the prompt after coordinator.max_attempts.
//
// Capacity: the actor registers with its engine's limits (max_num_seqs samples per prompt,
// max_sequence_tokens per sample), and the coordinator leases it only prompts within them.
//
// Delivery and rewards: actor/group_finisher.h.
//
// Thread-safety: Run once, on one thread (it starts and joins the other two); stats() from any
// thread.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>

#include "absl/status/statusor.h"
#include "actor/actor_options.h"
#include "actor/actor_stats.h"
#include "actor/coordinator_link.h"
#include "actor/engine_driver.h"
#include "actor/group_finisher.h"
#include "actor/lease_book.h"
#include "weight_broadcast/weight_transport.h"

namespace prl::actor {

class Actor {
 public:
  // `weights` (null: fixed weights) must outlive the actor.
  static absl::StatusOr<std::unique_ptr<Actor>> Create(
      std::shared_ptr<const ParameterSet> initial_weights, int64_t initial_version,
      GroupWriter write_group, WeightSubscriber* weights, const ActorOptions& options);

  // Works until *stop becomes true (or a permanent error: returned). Transient coordinator
  // errors are retried.
  absl::Status Run(const std::atomic<bool>* stop);

  ActorStats stats() const { return stats_.Get(); }
  // The OpenAI-compatible endpoint agents are told to call ("" when not served).
  std::string agents_base_url() const { return driver_.agents_base_url(); }

 private:
  Actor(std::unique_ptr<Engine> engine, GroupWriter write_group, WeightSubscriber* weights,
        const ActorOptions& options);

  // The control thread: registers, heartbeats, leases, until stop or a permanent error.
  void ControlLoop(const std::atomic<bool>* stop);
  // The finisher thread: GroupFinisher::Finish for each generated group, in order.
  void FinishLoop(const std::atomic<bool>* stop);
  // Keeps the first permanent error and stops every loop.
  void Fail(const absl::Status& error);
  bool Halted(const std::atomic<bool>* stop) const { return stop->load() || halted_.load(); }

  const ActorOptions options_;
  ActorStatsBoard stats_;
  LeaseBook book_;
  CoordinatorLink link_;
  EngineDriver driver_;
  GroupFinisher finisher_;
  std::mutex failure_mu_;
  absl::Status failure_;  // the first permanent error
  std::atomic<bool> halted_{false};
};

}  // namespace prl::actor
