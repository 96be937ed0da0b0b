// Actor: one actor server. It registers with the coordinator, leases prompts, generates each
// prompt's group with the paged KV-cache engine, scores the samples, writes the group to the
// replay buffer, and reports it done; between two engine steps it swaps in the newest weights
// the broadcaster delivered (generation never waits for them).
//
// Threads: the engine loop (Run's caller) only generates and swaps weights; the control thread
// registers, heartbeats and leases; the finisher scores, writes and completes each generated
// group. A slow reward, a full replay buffer or a slow coordinator therefore never pauses
// generation, and never stops the heartbeats that renew the leases being waited on
// (backpressure renews leases instead of losing them). The queues between them are bounded by
// max_prompts_in_flight: a lease counts from the moment it is granted until its group is
// completed or dropped, and the control thread leases only into free room. Heartbeats and
// leases share one thread, so a heartbeat lists exactly the leases held at that moment, and a
// group dropped (lost lease) leaves that list at once: the coordinator re-queues its prompt at
// the next heartbeat instead of when the lease expires. A group the actor gives up on (its
// engine refuses it, its reward fails) is released with its reason (ActorControl.Release, sent
// by the control thread before its next heartbeat); the coordinator counts either as a failed
// attempt of the prompt and fails the prompt after coordinator.max_attempts.
//
// Capacity: the actor registers with its engine's limits (max_num_seqs samples per prompt,
// max_sequence_tokens per sample), and the coordinator leases it only prompts within them.
//
// Delivery: a group is written to the replay buffer before it is reported complete. An actor
// killed in between leaves a group in the buffer whose lease expires, so the prompt is
// generated again (at-least-once, like the replay buffer itself); an actor killed earlier
// loses nothing that was accepted, since the coordinator re-queues its expired leases.
//
// Rewards: a group whose reward call fails (after the reward's own retries) is failed
// visibly — logged, counted in stats().reward_failures, not written and not completed, and
// released, so the coordinator re-runs the prompt (or fails it) — never written with a sample
// missing.
//
// Thread-safety: Run once, on one thread (it starts and joins the other two); stats() from any
// thread.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "inference_engine/engine.h"
#include "metrics/prl_metrics.h"
#include "prl/v1/prompt.grpc.pb.h"
#include "replay/ingest_server.h"
#include "replay/replay_buffer.h"
#include "reward/reward_function.h"
#include "reward/verifiers.h"
#include "tokenizer/text_codec.h"
#include "weight_broadcast/weight_transport.h"

namespace prl::actor {

// Where finished groups go: the local shared-memory buffer (LocalReplayWriter) or the remote
// gRPC ingest (RemoteReplayWriter). Blocks while the buffer is full (backpressure), up to a
// time-out.
using GroupWriter = std::function<absl::Status(absl::Span<const RolloutRecord> group)>;
GroupWriter LocalReplayWriter(ReplayBuffer* buffer, absl::Duration timeout);
absl::StatusOr<GroupWriter> RemoteReplayWriter(const std::string& address, absl::Duration timeout);

struct ActorOptions {
  std::string coordinator = "localhost:50051";
  std::string name = "actor";
  std::string run_id = "run";
  EngineOptions engine;
  int32_t max_prompts_in_flight = 8;  // leased and generating at once
  // The model's text (tokenizer/text_codec.h): completions decoded for the text rewards and for
  // clients watching samples (GroupResult.texts). Null: the ids are written as decimal numbers
  // separated by spaces (so that exact_match can compare with a reference written the same way)
  // and no texts are reported.
  std::shared_ptr<const tokenizer::TextCodec> text;
  // Prometheus metrics to update (null: none); they must outlive the actor.
  metrics::ActorMetrics* metrics = nullptr;
  metrics::WeightSyncMetrics* weight_metrics = nullptr;
  metrics::ProcessMetrics* process_metrics = nullptr;
  // How long a lease may wait for the weight version it requires (sync mode; a re-run of a
  // group handed back as stale); then the actor fails.
  absl::Duration weight_wait_timeout = absl::Seconds(600);
};

struct ActorStats {
  int64_t groups_written = 0, samples_written = 0, tokens_generated = 0;
  int64_t reward_failures = 0, duplicate_completions = 0;
  // Groups refused because their prompt's lease was no longer this actor's (it expired and
  // was re-leased, or the coordinator restarted): the prompt is re-run, the group dropped.
  int64_t lost_leases = 0;
  int64_t weight_version = 0, weight_swaps = 0;
  int64_t registrations = 0;
  int64_t groups_generated = 0;  // groups the engine finished (scored and written or not)
  int64_t leases_released = 0;   // given back to the coordinator (engine refusal, reward failure)
};

class Actor {
 public:
  // `weights` (null: fixed weights) must outlive the actor.
  static absl::StatusOr<std::unique_ptr<Actor>> Create(
      std::shared_ptr<const ParameterSet> initial_weights, int64_t initial_version,
      GroupWriter write_group, WeightSubscriber* weights, const ActorOptions& options);

  // Works until *stop becomes true (or a permanent error: returned). Transient coordinator
  // errors are retried.
  absl::Status Run(const std::atomic<bool>* stop);

  ActorStats stats() const;

 private:
  struct InFlight {
    prl::v1::LeasedPrompt lease;
    int64_t created_unix_nanos = 0;
  };
  struct Leased {  // granted, not yet in the engine
    prl::v1::LeasedPrompt lease;
    // The version its tokens must come from (LeaseResponse.min_weight_version): sync mode, or a
    // re-run of a stale group. It waits aside for it, the engine running the others meanwhile.
    int64_t min_weight_version = 0;
    absl::Time leased_at;
  };
  struct Generated {  // out of the engine, to be scored, written and completed
    InFlight job;
    RequestOutput output;
  };

  Actor(std::unique_ptr<Engine> engine, GroupWriter write_group, WeightSubscriber* weights,
        const ActorOptions& options);

  // The control thread: registers, heartbeats, leases, until stop or a permanent error.
  void ControlLoop(const std::atomic<bool>* stop);
  // The finisher thread: Finish for each generated group, in order.
  void FinishLoop(const std::atomic<bool>* stop);
  // One engine-loop iteration: swap, take in leased prompts, step, hand finished groups on.
  absl::Status EngineIteration(const std::atomic<bool>* stop);
  // Keeps the first permanent error and stops every loop.
  void Fail(const absl::Status& error);
  bool Halted(const std::atomic<bool>* stop) const { return stop->load() || halted_.load(); }
  // The lease is no longer worked on (completed or dropped): the next heartbeat omits it.
  void Drop(const std::string& lease_id);
  // Gives the lease up with a reason: dropped now, and released by the control thread.
  void Release(const std::string& lease_id, prl::v1::ReleaseReason reason, const absl::Status& why);
  // Sends the queued releases (control thread). A release that fails is left to the next
  // heartbeat, which no longer lists its lease.
  void SendReleases();
  std::string ActorId();

  absl::Status Register(const std::atomic<bool>* stop);
  absl::Status Heartbeat();
  absl::Status LeaseMore();
  // Moves leased prompts into the engine; one whose weight version has not arrived stays
  // leased (a DeadlineExceeded error after weight_wait_timeout).
  absl::Status AddLeased();
  // Swaps in the newest delivered weights, if newer than the engine's (between engine steps).
  absl::Status SwapIfNewer();
  void UpdateEngineGauges();
  // prl_weight_transfer_* from the subscriber's stats (it receives in the background).
  void UpdateTransferMetrics();

  // A finished request's group: scored, written to the replay buffer, reported complete; a
  // group whose scoring fails is counted and dropped (the lease expires and it is re-run).
  absl::Status Finish(const InFlight& job, const RequestOutput& output,
                      const std::atomic<bool>* stop);
  // Writes a group, retrying while the replay is unavailable (a restarting ingest) with
  // backoff for up to a minute; heartbeats keep the lease meanwhile.
  absl::Status WriteWithRetry(absl::Span<const RolloutRecord> records,
                              const std::atomic<bool>* stop);
  // The group's reward inputs (texts by options.text; a completion's text ends before its
  // stop token), then their rewards; the first error of either.
  absl::StatusOr<std::vector<reward::RewardInput>> RewardInputs(const RequestOutput& output,
                                                                const prl::v1::LeasedPrompt& lease,
                                                                uint64_t group_id) const;
  absl::StatusOr<std::vector<reward::RewardResult>> ScoreGroup(
      absl::Span<const reward::RewardInput> inputs, const prl::v1::LeasedPrompt& lease);
  void CountRewardFailure(const prl::v1::LeasedPrompt& lease, const absl::Status& failure);
  // The records of a scored group, and the coordinator's report of it.
  struct ScoredGroup {
    std::vector<RolloutRecord> records;  // in sample order
    prl::v1::CompleteRequest complete;
    int64_t tokens = 0;  // completion tokens of all samples
  };
  ScoredGroup BuildGroup(const InFlight& job, const RequestOutput& output,
                         absl::Span<const reward::RewardInput> inputs,
                         const std::vector<reward::RewardResult>& rewards, uint64_t group_id,
                         int64_t finished_unix_nanos) const;
  RolloutRecord MakeRecord(const InFlight& job, const RequestOutput& output, size_t sample,
                           const reward::RewardResult& reward, uint64_t group_id,
                           int64_t finished_unix_nanos) const;
  // Metrics and stats of a group written to the replay buffer.
  void CountWritten(const RequestOutput& output, const std::vector<reward::RewardResult>& rewards,
                    int64_t tokens);
  // Reports the group to the coordinator. NotFound (it does not know the actor or the lease,
  // e.g. after a restart) and transient errors are not the actor's: the group is in the buffer
  // and an unreported lease expires and is re-run (at-least-once, as above).
  absl::Status ReportComplete(const prl::v1::CompleteRequest& complete);
  // Counts a group refused with FailedPrecondition (the lease is no longer ours) and goes on.
  absl::Status LostLease(const absl::Status& refused);
  absl::StatusOr<reward::RewardFunction*> RewardFor(const prl::v1::RewardSpec& spec);
  absl::StatusOr<std::string> Text(absl::Span<const int32_t> ids) const;

  std::unique_ptr<Engine> engine_;
  GroupWriter write_group_;
  WeightSubscriber* weights_;
  ActorOptions options_;
  const prl::v1::ActorCapacity capacity_;  // declared at registration
  std::unique_ptr<prl::v1::ActorControl::Stub> control_;
  std::string actor_id_;  // guarded by mu_ (the control thread re-registers)
  int64_t heartbeat_ms_ = 5000;  // control thread
  int64_t staged_version_ = 0;          // newest weights handed to the engine
  bool waiting_for_weights_ = false;    // a lease waits for its version (engine loop only)
  int64_t versions_received_seen_ = 0;  // subscriber stats already in the metrics
  double transfer_seconds_seen_ = 0;
  std::map<uint64_t, InFlight> in_flight_;  // engine request id -> lease (engine loop only)
  std::map<std::string, std::unique_ptr<reward::RewardFunction>> rewards_;  // by spec (finisher)

  std::mutex mu_;  // guards held_, releases_, leased_, generated_, failure_
  std::condition_variable changed_;
  std::set<std::string> held_;      // lease ids granted and not yet completed or dropped
  // Leases given up, to be released (-> control thread); heartbeats list them until then.
  std::deque<prl::v1::ReleaseRequest> releases_;
  std::deque<Leased> leased_;       // control thread -> engine loop
  std::deque<Generated> generated_;  // engine loop -> finisher
  absl::Status failure_;
  std::atomic<bool> halted_{false};

  mutable std::mutex stats_mu_;
  ActorStats stats_;
};

}  // namespace prl::actor
