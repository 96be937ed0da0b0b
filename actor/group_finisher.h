// GroupFinisher: what happens to a generated group (the actor's finisher thread): its samples
// are scored, the group is written to the replay buffer, and then reported complete.
//
// Delivery: a group is written before it is reported complete. An actor killed in between
// leaves a group in the buffer whose lease expires, so the prompt is generated again
// (at-least-once, like the replay buffer itself).
// Rewards: a group whose reward call fails (after the reward's own retries) is failed visibly —
// logged, counted (ActorStats.reward_failures, prl_actor_reward_failures_total), not written,
// not completed, and released, so the coordinator re-runs the prompt (or fails it) — never
// written with a sample missing.
//
// Owns: the reward functions by spec. Thread-safety: one thread (the finisher).
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "actor/actor_options.h"
#include "actor/actor_stats.h"
#include "actor/coordinator_link.h"
#include "actor/lease_book.h"
#include "reward/reward_function.h"
#include "reward/verifiers.h"

namespace prl::actor {

class GroupFinisher {
 public:
  // Everything given must outlive the finisher.
  GroupFinisher(GroupWriter write_group, CoordinatorLink* link, LeaseBook* book,
                ActorStatsBoard* stats, const ActorOptions& options);

  // Scores, writes and completes the group; an error is permanent (the actor fails).
  absl::Status Finish(const GeneratedGroup& group, const std::function<bool()>& halted);

 private:
  // The records of a scored group, and the coordinator's report of it.
  struct ScoredGroup {
    std::vector<RolloutRecord> records;  // in sample order
    prl::v1::CompleteRequest complete;
    int64_t tokens = 0;  // completion tokens of all samples
  };
  // The group's reward inputs (texts by options.text; a completion's text ends before its stop
  // token), then their rewards; the first error of either.
  absl::StatusOr<std::vector<reward::RewardInput>> RewardInputs(const GeneratedGroup& group,
                                                                uint64_t group_id) const;
  absl::StatusOr<std::vector<reward::RewardResult>> Score(
      absl::Span<const reward::RewardInput> inputs, const prl::v1::LeasedPrompt& lease);
  void CountRewardFailure(const prl::v1::LeasedPrompt& lease, const absl::Status& failure);
  // An episode group's rewards: its environment's episode rewards (and the episode metrics).
  absl::StatusOr<std::vector<reward::RewardResult>> EpisodeRewards(const GeneratedGroup& group);
  ScoredGroup Build(const GeneratedGroup& group, absl::Span<const reward::RewardInput> inputs,
                    const std::vector<reward::RewardResult>& rewards, uint64_t group_id,
                    int64_t finished_unix_nanos) const;
  // One record's part of a group: a sample, or one segment of an agent's episode.
  struct RecordPart {
    size_t sample = 0;
    uint32_t segment = 0, segments = 1;
    const std::vector<int32_t>* prompt = nullptr;
    const SampleOutput* output = nullptr;
    const std::vector<uint32_t>* turn_ends = nullptr;  // null: one turn
    const std::vector<double>* turn_rewards = nullptr;
  };
  static std::vector<RecordPart> PartsOf(const GeneratedGroup& group);
  RolloutRecord MakeRecord(const GeneratedGroup& group, const RecordPart& part,
                           const reward::RewardResult& reward, uint64_t group_id,
                           int64_t finished_unix_nanos) const;
  // Writes, retrying while the replay is unavailable (a restarting ingest) with backoff for up
  // to a minute; heartbeats keep the lease meanwhile. A run of adapters' group goes to its
  // adapter's writer (ActorOptions::adapters).
  absl::Status WriteWithRetry(const prl::v1::LeasedPrompt& lease,
                              absl::Span<const RolloutRecord> records,
                              const std::function<bool()>& halted);
  void CountWritten(const RequestOutput& output, const std::vector<reward::RewardResult>& rewards,
                    int64_t tokens);
  // Reports the group. NotFound (the coordinator does not know the actor or the lease, e.g.
  // after a restart) and transient errors are not the actor's: the group is in the buffer and
  // an unreported lease expires and is re-run (at-least-once, as above).
  absl::Status Complete(const prl::v1::CompleteRequest& complete);
  // Counts a group refused with FailedPrecondition (the lease is no longer ours) and goes on.
  absl::Status LostLease(const absl::Status& refused);
  absl::StatusOr<std::string> Text(absl::Span<const int32_t> ids) const;

  GroupWriter write_group_;
  CoordinatorLink* link_;
  LeaseBook* book_;
  ActorStatsBoard* stats_;
  const ActorOptions& options_;
  std::map<std::string, std::unique_ptr<reward::RewardFunction>> rewards_;  // by spec
};

}  // namespace prl::actor
