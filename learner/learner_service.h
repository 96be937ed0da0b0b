// LearnerService: the learner role of a running pipeline. Every step it takes complete groups
// from the replay buffer (not training those older than max_lag versions, nor a second group
// of a prompt already trained: see "Exactly once" below), turns
// their rewards into group-normalised advantages, runs one FSDP training step
// (learner/train_step.h) over its ranks, acknowledges the groups, publishes the new weights
// to the actors, reports its progress to the coordinator, and checkpoints (learner/checkpointer.h).
// A restarted learner resumes from its latest checkpoint and publishes those weights first, as
// a version above any the weight transport already holds (weight_broadcast/versioning.h).
//
// Rank 0 reads the replay buffer and broadcasts the step's samples to the other ranks; every
// rank trains on its share.
//
// Durable training (with a checkpoint directory): rank 0 journals each step's samples on the
// checkpoint volume before the step trains (learner/step_journal.h) and only then acknowledges
// its groups to the replay buffer; a checkpoint drops the steps it covers. A learner killed
// between checkpoints resumes from the checkpoint, replays the journaled steps in order (not
// publishing weights the actors already hold), skips their groups if the buffer delivers them
// again, and then goes on: its weights, data order and version numbers are those of a learner
// that was never killed. Without a checkpoint directory, groups are acknowledged after the
// step that trained on them (a learner killed mid-step gets them again: at-least-once).
//
// Exactly once per prompt (learner/prompt_ledger.h): a group of a prompt the lineage already
// trained on is acknowledged without training. A group older than max_lag is not trained
// either: with reopen_stale its prompt goes back to the coordinator to be generated again, as
// a quarantined group's does (learner/prompt_hand_back.h: the group is acknowledged once the
// coordinator accepted that), else it is dropped and counted.
// Parts, each owning its state: learner/step_intake.h (rank 0: where a step's samples come
// from — the journal, or the replay buffer through learner/group_admission.h, which owns the
// ledger, the quarantine and the hand-back — and their advantages), learner/step_samples.h
// (the step's bytes in the replay record codec), learner/checkpointer.h. The service itself
// runs the collective step: share the samples, train, publish, checkpoint, report.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "learner/advantages.h"
#include "learner/comm_thread.h"
#include "learner/checkpointer.h"
#include "learner/fsdp.h"
#include "learner/optimizer.h"
#include "learner/prompt_hand_back.h"
#include "learner/step_intake.h"
#include "learner/step_report.h"
#include "learner/step_batcher.h"
#include "learner/step_turns.h"
#include "learner/train_step.h"
#include "replay/quarantine.h"
#include "replay/replay_buffer.h"
#include "weight_broadcast/weight_transport.h"

namespace prl::learner {

struct LearnerServiceOptions {
  int64_t groups_per_step = 8;
  int64_t max_lag = 4;                             // groups whose oldest token is older are dropped
  int64_t max_steps = 0;                           // 0: until stopped
  absl::Duration take_timeout = absl::Seconds(1);  // per wait for groups (then re-checks stop)
  CheckpointPolicy checkpoint;                     // last_step is set from max_steps
  StepConfig step;
  AdvantageConfig advantages;
  double lr = 0;  // the optimizer's, for the reports
  // Quarantine (replay/quarantine.h): a taken group that fails the check against the model
  // is written here as one JSONL line (empty: counted only), acknowledged and never trained;
  // its prompt is handed back through reopen_stale (reason "quarantined: ...").
  std::string dead_letter_path;
  // Hands the prompts of stale and of quarantined groups back to the coordinator
  // (ActorControl.ReopenPrompts: generated again, or failed after their last attempt); called
  // on rank 0, retried at most every reopen_retry while it fails; a group is acknowledged
  // once its prompt was taken back. Null: stale groups are dropped by the buffer, quarantined
  // ones acknowledged.
  std::function<absl::Status(const std::vector<StalePrompt>&)> reopen_stale;
  // Prompt sets the coordinator retired since the last call (LearnerProgressResponse
  // .retired_prompt_sets): their keys leave the ledger, which stays bounded by the live sets.
  // Called on rank 0 once per step. Null: the ledger keeps every key.
  std::function<std::vector<std::string>()> retired_prompt_sets;
  absl::Duration reopen_retry = absl::Milliseconds(500);
  // Called on rank 0 once the service has resumed, before its first step, with its weight
  // version and groups consumed: the learner role starts reporting its progress to the
  // coordinator from here when learner.drop_uniform_groups is on (the groups it drops before
  // its first step would otherwise count against the lag budget, and could fill it). Null: none.
  std::function<void(int64_t version, int64_t groups_consumed)> on_started;
  // A run of adapters (docs/tenants.md): the turns this service's trainer takes with the other
  // adapters' (learner/step_turns.h), held from when a step's samples are in until it is
  // published and checkpointed, and while it resumes. Null: none (the only trainer).
  StepTurns* turns = nullptr;
  // A run of adapters: the rank's one thread its trainers' steps run on (learner/
  // comm_thread.h: one OpenMP team); null: the caller's thread.
  CommThread* step_thread = nullptr;
  // A run of adapters trained in joint steps (learner/step_batcher.h): the service hands its
  // steps to the rank's batcher instead (outside its turns, which the batcher takes for the
  // round), and says when it waits for groups. Null: its own TrainStep.
  StepBatcher* batcher = nullptr;
};

// What rank 0 reports after each step: the StepReport, and per trained sample (where the actor
// recorded token versions) the learner version minus its oldest token version and minus its
// mean token version, for the lag histograms.
struct LearnerStepReport {
  StepReport report;
  std::vector<double> sample_max_lags, sample_mean_lags;
};

class LearnerService {
 public:
  // Rank 0 passes the replay buffer and the publisher (both must outlive the service); other
  // ranks pass null for both. `model` and `optimizer` hold the starting weights.
  LearnerService(FsdpModel* model, ShardedOptimizer* optimizer, ReplayBuffer* replay,
                 WeightPublisher* publisher, const LearnerServiceOptions& options);

  // Resumes from the checkpoint if any, publishes the current weights, then steps until *stop
  // or max_steps. on_step runs on rank 0 after each step (progress lines, metrics, reporting
  // to the coordinator). A collective: every rank calls it.
  absl::Status Run(const std::atomic<bool>* stop,
                   const std::function<void(const LearnerStepReport&)>& on_step);

  int64_t version() const { return state_.weight_version; }
  int64_t groups_consumed() const { return state_.data_position; }
  // Rank 0: the groups of the step in progress (taken, possibly acknowledged, not yet trained
  // and reported); part of the backlog the coordinator's lag budget counts. Any thread.
  int64_t groups_in_step() const { return intake_ ? intake_->groups_in_step() : 0; }
  // Groups dead-lettered by rank 0, by reason (prl_replay_groups_dead_lettered_total).
  QuarantineCounts dead_letters() const {
    return intake_ ? intake_->admission().dead_letters() : QuarantineCounts{};
  }

 private:
  absl::Status Resume();
  // Numbers the next version above what the transport holds (every rank agrees). When it holds
  // exactly the learner's version, those weights are already out: the next Publish is skipped.
  absl::Status NumberAboveTransport();
  absl::Status Publish();
  // One optimizer step on every rank; false when rank 0 was told to stop before a full step.
  absl::StatusOr<bool> Step(const std::atomic<bool>* stop,
                            const std::function<void(const LearnerStepReport&)>& on_step);
  // Rank 0's step bytes (or its stop signal) on every rank, decoded: nullopt means stop.
  absl::StatusOr<std::optional<std::vector<TrainSample>>> ShareSamples(std::vector<uint8_t> bytes);

  FsdpModel* model_;
  ShardedOptimizer* optimizer_;
  ReplayBuffer* replay_;
  WeightPublisher* publisher_;
  LearnerServiceOptions options_;
  Checkpointer checkpointer_;
  std::optional<StepIntake> intake_;  // rank 0: where steps come from (learner/step_intake.h)
  std::optional<ParameterSet> full_;  // the gathered weights Publish hands to the publisher
  std::optional<LoraSet> adapter_;     // LoRA: the gathered adapter Publish hands over instead
  TrainingState state_;
  StepReport reported_;         // rank 0: the previous step's report (its totals)
  int64_t replay_through_ = 0;  // every rank: the last step replayed from the journal
  bool skip_publish_ = false;   // every rank: the transport holds these weights
  // options.batcher: this trainer's membership while it runs (Run), told when it waits.
  std::unique_ptr<StepBatcher::Member> member_;
};

}  // namespace prl::learner
