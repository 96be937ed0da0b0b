// EngineDriver: the actor's engine loop. Between two engine steps it swaps in the newest
// weights the broadcaster delivered (generation never waits for them), moves granted prompts
// into the episode engine (one that must come from weights not yet delivered waits aside, the
// engine running the others), gives back the groups the coordinator reclaimed or that lost
// their lease, steps (episode/episode_engine.h: the engine with its groups' agentic
// episodes), and hands finished groups to the finisher and failed ones back to the
// coordinator.
//
// Owns: the episode engine (and through it the engine and every group's state), the leases of
// the groups in it, the version handed to the engine, and what of the weight subscriber's
// statistics the metrics already show. Thread-safety: one thread (the actor's engine loop).
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "actor/actor_options.h"
#include "actor/actor_stats.h"
#include "actor/lease_book.h"
#include "episode/episode_engine.h"
#include "inference_engine/engine.h"
#include "weight_broadcast/weight_transport.h"

namespace prl::actor {

class EngineDriver {
 public:
  // `weights` (null: fixed weights), `book` and `stats` must outlive the driver.
  EngineDriver(std::unique_ptr<Engine> engine, WeightSubscriber* weights, LeaseBook* book,
               ActorStatsBoard* stats, const ActorOptions& options);

  // One iteration: swap, take in granted prompts, give back, step, hand groups on; idle, waits
  // briefly for a grant, an environment's answer (or `halted`).
  absl::Status Iteration(const std::function<bool()>& halted);

  const Engine& engine() const { return episodes_.engine(); }
  // Serves agents' endpoint (ActorOptions::openai); its base URL, for the start-up line.
  absl::Status ServeAgents();
  std::string agents_base_url() const { return episodes_.agents_base_url(); }

 private:
  struct Leased {
    prl::v1::LeasedPrompt lease;
    int64_t created_unix_nanos = 0;
  };
  absl::Status SwapIfNewer();
  // A run of adapters (ActorOptions::adapters): whether the engine holds the lease's adapter at
  // the version it needs (opening its channel and taking its newest version as needed); false:
  // not yet (the learner has not made or published it). An error gives the lease back.
  absl::StatusOr<bool> AdapterReady(const prl::v1::LeasedAdapter& adapter);
  // The adapter's newest version newer than `have` into the engine (Engine::AddAdapter with its
  // version); a failed channel is closed.
  absl::Status SwapAdapterIfNewer(const std::string& adapter_id, int64_t have);
  // Every adapter the engine holds, to its newest version; about once a second, the channels of
  // deleted adapters are closed and those adapters leave the engine once no request uses them.
  absl::Status SwapAdaptersIfNewer();
  void CloseGoneAdapters();
  // Moves granted prompts into the engine; one whose weight version has not arrived waits
  // (a DeadlineExceeded error after weight_wait_timeout).
  absl::Status AddGranted();
  // Reclaimed leases are released (not failed attempts), lost ones dropped: their groups leave
  // the engine and their environments hear of it.
  void GiveBack();
  // Finished groups to the finisher, failed ones released with their reason.
  void HandOn();
  void UpdateEngineGauges();
  // prl_weight_transfer_* from the subscriber's stats (it receives in the background).
  void UpdateTransferMetrics();

  episode::EpisodeEngine episodes_;
  WeightSubscriber* weights_;
  LeaseBook* book_;
  ActorStatsBoard* stats_;
  const ActorOptions& options_;
  std::map<std::string, Leased> leases_;  // the leases of the groups in episodes_, by lease id
  int64_t staged_version_ = 0;            // newest weights handed to the engine
  absl::Time adapters_checked_ = absl::InfinitePast();  // CloseGoneAdapters' last look
  bool waiting_for_weights_ = false;      // a granted prompt waits for its version
  int64_t versions_received_seen_ = 0;    // subscriber stats already in the metrics
  double transfer_seconds_seen_ = 0;
};

// The episode engine's request for a leased prompt: its tokens, the engine's sampling
// parameters (its seed mixed with the lease id), and its environment when it has one.
episode::GroupRequest GroupRequestOf(const prl::v1::LeasedPrompt& lease);

}  // namespace prl::actor
