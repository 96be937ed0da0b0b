// LeaseBook: the actor's leases from the moment the coordinator grants them until their group
// is completed, dropped or released, and the hand-offs between the actor's three threads:
// granted prompts (control thread -> engine loop) and generated groups (engine loop ->
// finisher). A lease counts against max_prompts_in_flight all that time, so the control thread
// leases only into free room; heartbeats list exactly the leases held (and those queued for
// release, until their release is sent).
//
// Owns: the held lease ids, the queued releases, the granted and the generated queues, and the
// condition variable every wait of the actor's loops uses (Wake: a stop or a failure).
// Thread-safety: every method may be called from any thread.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "episode/group.h"
#include "inference_engine/engine.h"
#include "prl/v1/prompt.pb.h"

namespace prl::actor {

// A granted prompt, not yet in the engine.
struct LeasedPrompt {
  prl::v1::LeasedPrompt lease;
  // The version its tokens must come from (LeaseResponse.min_weight_version): sync mode, or a
  // re-run of a stale group. It waits aside for it, the engine running the others meanwhile.
  int64_t min_weight_version = 0;
  absl::Time leased_at;
};

// A group out of the engine, to be scored, written and completed.
struct GeneratedGroup {
  prl::v1::LeasedPrompt lease;
  int64_t created_unix_nanos = 0;  // when it went into the engine
  RequestOutput output;
  // Agentic episodes (episode/episode_engine.h): each sample's outcome; empty for one turn.
  std::vector<episode::EpisodeOutcome> episodes;
};

class LeaseBook {
 public:
  explicit LeaseBook(int64_t max_in_flight) : max_in_flight_(max_in_flight) {}

  // Leases the control thread may ask for now (max_prompts_in_flight minus those held).
  int64_t Room() const;
  // The coordinator granted these: held, and queued for the engine loop.
  void Grant(const prl::v1::LeaseResponse& response);
  // The granted prompts, for the engine loop; those that must wait for weights come back with
  // Requeue, ahead of prompts granted meanwhile.
  std::deque<LeasedPrompt> TakeGranted();
  void Requeue(std::deque<LeasedPrompt> waiting);
  // Waits up to `timeout` for a granted prompt or `halted`.
  void WaitForGranted(absl::Duration timeout, const std::function<bool()>& halted);

  void Generated(std::vector<GeneratedGroup> groups);
  // The next generated group, waiting up to `timeout` (nullopt: none, or `halted`).
  std::optional<GeneratedGroup> NextGenerated(absl::Duration timeout,
                                              const std::function<bool()>& halted);

  // The lease is no longer worked on (completed or dropped): the next heartbeat omits it.
  void Drop(const std::string& lease_id);
  // Gives the lease up with a reason: dropped now, released by the control thread. Once per
  // lease: a lease no longer held (released, dropped) is not released again (false).
  bool Release(const std::string& lease_id, prl::v1::ReleaseReason reason, const absl::Status& why);

  // What the coordinator's heartbeat asked back (HeartbeatResponse): leases to give back for a
  // fair share, and leases it no longer counts as ours. A granted prompt not yet in the engine
  // is released (or dropped) here at once; the others wait for the engine loop.
  void GiveBack(const std::vector<std::string>& reclaimed, const std::vector<std::string>& lost);
  struct GivenBack {
    std::vector<std::string> reclaimed, lost;
  };
  GivenBack TakeGivenBack();
  std::deque<prl::v1::ReleaseRequest> TakeReleases();
  // What a heartbeat lists: the held leases and those waiting to be released.
  std::vector<std::string> HeldForHeartbeat() const;

  // Waits up to `timeout` for any change (a grant, a group, a drop, a release, a wake).
  void Wait(absl::Duration timeout);
  // Wakes every wait (a stop or a failure).
  void Wake();

 private:
  const int64_t max_in_flight_;
  mutable std::mutex mu_;
  std::condition_variable changed_;
  std::set<std::string> held_;  // granted and not yet completed, dropped or released
  std::deque<prl::v1::ReleaseRequest> releases_;
  GivenBack given_back_;
  std::deque<LeasedPrompt> granted_;
  std::deque<GeneratedGroup> generated_;
};

}  // namespace prl::actor
