// EngineDriver: the actor's engine loop. Between two engine steps it swaps in the newest
// weights the broadcaster delivered (generation never waits for them), moves granted prompts
// into the engine (one that must come from weights not yet delivered waits aside, the engine
// running the others), applies what agentic episodes decided (continue a sample with its
// environment's reply, finish it, abort its group: actor/episode_runner.h), steps, hands the
// turns that ended to the episodes, and finished groups to the finisher.
//
// Owns: the engine, the prompts in it (request id -> lease), the version handed to the engine,
// and what of the weight subscriber's statistics the metrics already show. Thread-safety: one
// thread (the actor's engine loop).
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>

#include "absl/status/status.h"
#include "actor/actor_options.h"
#include "actor/actor_stats.h"
#include "actor/episode_runner.h"
#include "actor/lease_book.h"
#include "inference_engine/engine.h"
#include "weight_broadcast/weight_transport.h"

namespace prl::actor {

class EngineDriver {
 public:
  // `weights` (null: fixed weights), `book` and `stats` must outlive the driver.
  EngineDriver(std::unique_ptr<Engine> engine, WeightSubscriber* weights, LeaseBook* book,
               ActorStatsBoard* stats, const ActorOptions& options);

  // One iteration: swap, take in granted prompts, step, hand finished groups on; idle, waits
  // briefly for a grant (or `halted`).
  absl::Status Iteration(const std::function<bool()>& halted);

  const Engine& engine() const { return *engine_; }

 private:
  struct InEngine {
    prl::v1::LeasedPrompt lease;
    int64_t created_unix_nanos = 0;
  };
  absl::Status SwapIfNewer();
  // Moves granted prompts into the engine; one whose weight version has not arrived waits
  // (a DeadlineExceeded error after weight_wait_timeout).
  absl::Status AddGranted();
  void UpdateEngineGauges();
  // prl_weight_transfer_* from the subscriber's stats (it receives in the background).
  void UpdateTransferMetrics();
  // The engine's sampling parameters of a lease (its seed mixed with the lease id).
  static SamplingParams ParamsOf(const prl::v1::LeasedPrompt& lease);
  // Applies the episodes' actions; an action that fails aborts its group.
  void ApplyEpisodeActions();
  // Hands the requests the engine finished to the finisher (with their episodes' outcomes).
  void HandOnFinished();
  // Ends an episode group that failed: out of the engine, released with the reason.
  void AbortGroup(const std::string& lease_id, uint64_t request_id, const absl::Status& why);

  std::unique_ptr<Engine> engine_;
  WeightSubscriber* weights_;
  LeaseBook* book_;
  ActorStatsBoard* stats_;
  const ActorOptions& options_;
  std::map<uint64_t, InEngine> in_engine_;  // engine request id -> its lease
  std::map<std::string, InEngine> starting_;  // episode groups whose episodes are starting
  std::unique_ptr<EpisodeRunner> episodes_;
  int64_t staged_version_ = 0;              // newest weights handed to the engine
  bool waiting_for_weights_ = false;        // a granted prompt waits for its version
  int64_t versions_received_seen_ = 0;      // subscriber stats already in the metrics
  double transfer_seconds_seen_ = 0;
};

}  // namespace prl::actor
