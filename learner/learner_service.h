// LearnerService: the learner role of a running pipeline. Every step it takes complete groups
// from the replay buffer (dropping, and counting, those older than max_lag versions), turns
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
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "learner/advantages.h"
#include "learner/checkpointer.h"
#include "learner/fsdp.h"
#include "learner/optimizer.h"
#include "learner/step_journal.h"
#include "learner/step_report.h"
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
  // is written here as one JSONL line (empty: counted only), acknowledged and never trained.
  std::string dead_letter_path;
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
  // Groups dead-lettered by rank 0, by reason (prl_replay_groups_dead_lettered_total).
  QuarantineCounts dead_letters() const { return quarantine_.counts(); }

 private:
  absl::Status Resume();
  // Numbers the next version above what the transport holds (every rank agrees). When it holds
  // exactly the learner's version, those weights are already out: the next Publish is skipped.
  absl::Status NumberAboveTransport();
  absl::Status Publish();
  // One optimizer step on every rank; false when rank 0 was told to stop before a full step.
  absl::StatusOr<bool> Step(const std::atomic<bool>* stop,
                            const std::function<void(const LearnerStepReport&)>& on_step);
  // Rank 0: the step's groups as samples (empty when stopping). Broadcast to every rank.
  absl::StatusOr<std::vector<TrainSample>> NextSamples(const std::atomic<bool>* stop,
                                                       std::vector<LeasedGroup>* leased,
                                                       StepReport* report);
  // Rank 0: the next step's samples as broadcast bytes (empty: stop), from the journal while
  // replaying, else from the replay buffer (journaled, then acknowledged, when journaling).
  absl::StatusOr<std::vector<uint8_t>> NextStepBytes(const std::atomic<bool>* stop,
                                                     std::vector<LeasedGroup>* leased,
                                                     StepReport* report);
  // Rank 0's step bytes (or its stop signal) on every rank, decoded: nullopt means stop.
  absl::StatusOr<std::optional<std::vector<TrainSample>>> ShareSamples(std::vector<uint8_t> bytes);

  FsdpModel* model_;
  ShardedOptimizer* optimizer_;
  ReplayBuffer* replay_;
  WeightPublisher* publisher_;
  LearnerServiceOptions options_;
  Checkpointer checkpointer_;
  Quarantine quarantine_;             // rank 0: groups the model cannot take never reach a step
  std::optional<ParameterSet> full_;  // the gathered weights Publish hands to the publisher
  TrainingState state_;
  std::optional<StepJournal> journal_;   // rank 0, with a checkpoint directory
  std::vector<JournaledStep> to_replay_;  // rank 0: journaled steps not yet replayed
  std::set<uint64_t> replayed_keys_;     // rank 0: their groups, skipped if delivered again
  int64_t replay_through_ = 0;           // every rank: the last step replayed from the journal
  bool skip_publish_ = false;            // every rank: the transport holds these weights
  bool took_since_resume_ = false;       // rank 0
};

}  // namespace prl::learner
