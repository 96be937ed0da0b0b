// StepIntake: where rank 0's steps come from (learner/learner_service.h). While a step's groups
// are being taken, those already in it have their replay leases renewed between waits (every
// take_timeout), so slow actors do not make the buffer deliver them again. A step's samples,
// as the bytes every rank trains on (learner/step_samples.h), are either a journaled step
// being replayed after a restart, or groups taken from the replay buffer: each admitted or
// not (learner/group_admission.h), turned into samples with group-normalised advantages
// (learner/advantages.h), then — with a checkpoint directory — journaled durably
// (learner/step_journal.h) before the groups are acknowledged; without one, the caller
// acknowledges them after training.
//
// Owns: the group admission (ledger, quarantine, hand-back), the journal and the steps left to
// replay, and the count of groups in the step in progress. Rank 0 only; not for concurrent
// use, except groups_in_step() (any thread).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "learner/advantages.h"
#include "learner/group_admission.h"
#include "learner/rollouts.h"
#include "learner/step_journal.h"
#include "learner/step_report.h"
#include "replay/replay_buffer.h"

namespace prl::learner {

struct IntakeOptions {
  int64_t groups_per_step = 8;
  absl::Duration take_timeout = absl::Seconds(1);  // per wait for groups (then re-checks stop)
  AdvantageConfig advantages;
  AdmissionOptions admission;
  // Prompt sets the coordinator retired since the last call (null: none); once per step.
  std::function<std::vector<std::string>()> retired_prompt_sets;
  // Called once per step when the groups in the buffer do not fill it and the intake is about
  // to wait for more (a run of adapters' step batcher then starts rounds without this
  // trainer: learner/step_batcher.h). Null: none (and the first take waits at once).
  std::function<void()> on_wait;
};

// The advantages of one group's records (replay/rollout_group.h): its episodes' advantages,
// every record of an episode taking its episode's (an agent's episode may be several records,
// one per segment, all carrying the episode's reward: docs/agents.md). An episode counts once
// in the group's statistics however many records it has.
struct EpisodeAdvantagesResult {
  std::vector<double> advantage;        // per record, in input order
  std::vector<bool> kept;               // per record: false when its group was dropped
  std::vector<double> episode_rewards;  // per episode, in order of first appearance
};
absl::StatusOr<EpisodeAdvantagesResult> EpisodeAdvantages(absl::Span<const RolloutRecord> records,
                                                          const AdvantageConfig& config);

class StepIntake {
 public:
  // `replay` must outlive this.
  StepIntake(const ModelLimits& limits, ReplayBuffer* replay, IntakeOptions options);

  // After the checkpoint (if any) was loaded at `step`: opens the journal in `checkpoint_dir`
  // (empty: no journal), reads the checkpoint's ledger when `resumed`, and queues the
  // journaled steps after `step`. Returns how many will be replayed.
  absl::StatusOr<int64_t> Resume(const std::string& checkpoint_dir, int64_t step, bool resumed);

  // The bytes of step `step` (the next one), trained at `learner_version`: the next journaled
  // step while replaying, else groups taken until groups_per_step or *stop. Taken groups not
  // yet acknowledged (no journal) are left in `leased` for the caller to acknowledge after
  // training; stopping before a full step releases them and returns the stop signal.
  absl::StatusOr<std::vector<uint8_t>> Next(const std::atomic<bool>* stop, int64_t step,
                                            int64_t learner_version,
                                            std::vector<LeasedGroup>* leased, StepReport* report);
  // A checkpoint at `step` is durable: the journal drops the steps it covers.
  absl::Status Checkpointed(int64_t step);
  // The step in progress was reported: its groups are no longer in it.
  void Reported() { groups_in_step_ = 0; }

  // Groups of the step in progress (taken, possibly acknowledged, not yet trained and
  // reported): part of the backlog the coordinator's lag budget counts. Any thread.
  int64_t groups_in_step() const { return groups_in_step_.load(); }
  // Groups dropped since start because their rewards were all equal (with
  // AdvantageConfig::drop_uniform_groups): acknowledged at once, not counted in any step.
  int64_t dropped_uniform() const { return dropped_uniform_; }
  GroupAdmission& admission() { return admission_; }
  const GroupAdmission& admission() const { return admission_; }

 private:
  // Groups taken until a full step (or *stop), as samples.
  absl::StatusOr<std::vector<TrainSample>> Take(const std::atomic<bool>* stop,
                                                int64_t learner_version,
                                                std::vector<LeasedGroup>* leased,
                                                StepReport* report);

  ReplayBuffer* replay_;
  IntakeOptions options_;
  GroupAdmission admission_;
  std::optional<StepJournal> journal_;   // with a checkpoint directory
  std::vector<JournaledStep> to_replay_; // journaled steps not yet replayed, in order
  bool took_since_resume_ = false;
  std::atomic<int64_t> groups_in_step_{0};
  int64_t dropped_uniform_ = 0;
};

}  // namespace prl::learner
