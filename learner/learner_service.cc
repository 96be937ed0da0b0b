#include "learner/learner_service.h"

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "learner/activation_budget.h"
#include "learner/step_samples.h"
#include "weight_broadcast/versioning.h"

namespace prl::learner {

namespace {

// Rank 0's per-sample lags (learner version minus the oldest and the mean token version) and
// the completion tokens of the samples trained on.
void AddSampleLags(absl::Span<const TrainSample> samples, int64_t learner_version,
                   LearnerStepReport* out) {
  const double version = static_cast<double>(learner_version);
  int64_t multi_turn = 0;
  for (const TrainSample& sample : samples) {
    multi_turn +=
        std::find(sample.sources.begin(), sample.sources.end(), 1) != sample.sources.end() ? 1 : 0;
  }
  out->report.multi_turn_fraction =
      samples.empty() ? 0.0 : static_cast<double>(multi_turn) / static_cast<double>(samples.size());
  for (const TrainSample& sample : samples) {
    const int64_t trained = sample.trained_tokens();  // not an episode's environment tokens
    out->report.completion_tokens += trained;
    out->report.completion_tokens_max = std::max(out->report.completion_tokens_max, trained);
    int64_t oldest = INT64_MAX, count = 0;
    double sum = 0;
    for (size_t t = 0; t < sample.versions.size(); ++t) {
      if (!sample.trained(t)) continue;
      oldest = std::min(oldest, sample.versions[t]);
      sum += static_cast<double>(sample.versions[t]);
      ++count;
    }
    if (count == 0) continue;
    out->sample_max_lags.push_back(version - static_cast<double>(oldest));
    out->sample_mean_lags.push_back(version - sum / static_cast<double>(count));
  }
}

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

LearnerService::LearnerService(FsdpModel* model, ShardedOptimizer* optimizer, ReplayBuffer* replay,
                               WeightPublisher* publisher, const LearnerServiceOptions& options)
    : model_(model),
      optimizer_(optimizer),
      replay_(replay),
      publisher_(publisher),
      options_(options),
      checkpointer_([&] {
        CheckpointPolicy policy = options.checkpoint;
        policy.last_step = options.max_steps;
        return policy;
      }()) {
  if (replay == nullptr) return;  // ranks other than 0
  IntakeOptions intake;
  intake.groups_per_step = options.groups_per_step;
  intake.take_timeout = options.take_timeout;
  intake.advantages = options.advantages;
  intake.retired_prompt_sets = options.retired_prompt_sets;
  if (options.batcher != nullptr) {
    intake.on_wait = [this] {
      if (member_ != nullptr) member_->Waiting();
    };
  }
  intake.admission.max_lag = options.max_lag;
  intake.admission.dead_letter_path = options.dead_letter_path;
  intake.admission.reopen = options.reopen_stale;
  intake.admission.reopen_retry = options.reopen_retry;
  ModelLimits limits = LimitsOfModel(model->config());
  if (const int64_t budget = options.step.activation_budget_bytes; budget > 0) {
    const PassPlanner planner = PlannerOf(*model);
    limits.max_trained_tokens = std::max<int64_t>(planner.MaxSequenceTokens(budget), 1);
    limits.max_trained_tokens_why = planner.DescribeLimits(budget);
  }
  intake_.emplace(limits, replay, std::move(intake));
}

absl::Status LearnerService::Publish() {
  // Every rank takes part in the gather; rank 0 publishes. The full copy is allocated once.
  if (const LoraConfig* lora = model_->lora_config(); lora != nullptr) {
    // LoRA: the adapter alone (the actors hold the base; the publisher's spec is the adapter's).
    if (!adapter_.has_value()) {
      PRL_ASSIGN_OR_RETURN(adapter_,
                           LoraSet::Allocate(model_->config(), *lora, Device::Cpu(), false));
    }
    PRL_RETURN_IF_ERROR(model_->GatherFullParams(
        {adapter_->data(), static_cast<size_t>(adapter_->layout.num_elements())}));
    if (publisher_ == nullptr) return absl::OkStatus();
    return publisher_->Publish(state_.weight_version, *adapter_);
  }
  if (!full_.has_value()) {
    PRL_ASSIGN_OR_RETURN(full_, ParameterSet::Allocate(model_->config(), Device::Cpu(), false));
  }
  PRL_RETURN_IF_ERROR(
      model_->GatherFullParams({full_->data(), static_cast<size_t>(full_->layout.num_elements())}));
  if (publisher_ == nullptr) return absl::OkStatus();
  return publisher_->Publish(state_.weight_version, *full_);
}

absl::StatusOr<std::optional<std::vector<TrainSample>>> LearnerService::ShareSamples(
    std::vector<uint8_t> bytes) {
  int64_t size = static_cast<int64_t>(bytes.size());
  PRL_RETURN_IF_ERROR(model_->RunCollective([&](collective::Communicator& c) {
    PRL_RETURN_IF_ERROR(c.BroadcastHost({reinterpret_cast<uint8_t*>(&size), sizeof(size)}, 0));
    bytes.resize(static_cast<size_t>(size));
    return c.BroadcastHost(absl::MakeSpan(bytes), 0);
  }));
  return DecodeStepSamples(bytes);
}

absl::Status LearnerService::Resume() {
  PRL_ASSIGN_OR_RETURN(const std::optional<TrainingState> resumed,
                       checkpointer_.Resume(*model_, *optimizer_));
  const bool rank0 = model_->rank() == 0;
  if (resumed.has_value()) {
    state_ = *resumed;
    if (rank0) {
      std::printf("learner: resumed from %s at step %lld (weight version %lld)\n",
                  checkpointer_.policy().dir.c_str(), static_cast<long long>(state_.step),
                  static_cast<long long>(state_.weight_version));
    }
  }
  int64_t replay_steps = 0;
  if (rank0) {
    PRL_ASSIGN_OR_RETURN(replay_steps, intake_->Resume(checkpointer_.policy().dir, state_.step,
                                                       resumed.has_value()));
  }
  std::fflush(stdout);
  PRL_RETURN_IF_ERROR(model_->RunCollective([&](collective::Communicator& c) {
    return c.BroadcastHost({reinterpret_cast<uint8_t*>(&replay_steps), sizeof(replay_steps)}, 0);
  }));
  replay_through_ = state_.step + replay_steps;
  // Weights an earlier learner published past the checkpoint are replayed, not renumbered.
  return replay_steps > 0 ? absl::OkStatus() : NumberAboveTransport();
}

absl::Status LearnerService::NumberAboveTransport() {
  // Rank 0 knows what the transport already holds (an earlier learner of the run may have
  // published past this checkpoint); every rank numbers on from there.
  int64_t next[2] = {state_.weight_version, 0};  // the version, and whether it is out already
  if (publisher_ != nullptr) {
    const int64_t newest = publisher_->newest_version();
    next[1] = newest == state_.weight_version ? 1 : 0;
    if (next[1] == 0) next[0] = FirstVersionToPublish(state_.weight_version, newest);
  }
  PRL_RETURN_IF_ERROR(model_->RunCollective([&](collective::Communicator& c) {
    return c.BroadcastHost({reinterpret_cast<uint8_t*>(next), sizeof(next)}, 0);
  }));
  state_.weight_version = next[0];
  skip_publish_ = next[1] != 0;
  return absl::OkStatus();
}

absl::StatusOr<bool> LearnerService::Step(
    const std::atomic<bool>* stop, const std::function<void(const LearnerStepReport&)>& on_step) {
  const bool rank0 = model_->rank() == 0;
  const bool replaying = state_.step < replay_through_;
  LearnerStepReport out;
  std::vector<LeasedGroup> leased;
  std::vector<uint8_t> bytes;
  if (rank0) {
    PRL_ASSIGN_OR_RETURN(
        bytes, intake_->Next(stop, state_.step + 1, state_.weight_version, &leased, &out.report));
  }
  if (member_ != nullptr) member_->Busy();  // its step is coming
  // A run of adapters: one trainer's step at a time, in turn (LearnerServiceOptions::turns).
  std::optional<StepTurns::Turn> turn;
  if (options_.turns != nullptr) turn.emplace(options_.turns->Take());
  PRL_ASSIGN_OR_RETURN(std::optional<std::vector<TrainSample>> samples,
                       ShareSamples(std::move(bytes)));
  if (!samples.has_value()) return false;  // rank 0 was told to stop
  StepResult result;
  if (!samples->empty() && member_ != nullptr) {  // in the batcher's next round
    turn.reset();                                 // (the batcher takes one for the round)
    PRL_ASSIGN_OR_RETURN(result, member_->Train({model_, optimizer_, *samples, &options_.step,
                                                 state_.weight_version}));
    if (options_.turns != nullptr) turn.emplace(options_.turns->Take());
  } else if (!samples->empty()) {
    const auto train = [&] {
      return TrainStep(*model_, *optimizer_, *samples, options_.step, state_.weight_version);
    };
    absl::StatusOr<StepResult> trained = absl::UnknownError("not run");
    if (options_.step_thread != nullptr) {  // what the step throws is thrown here
      options_.step_thread
          ->Submit([&] {
            trained = train();
            return trained.status();
          })
          .get();
    } else {
      trained = train();
    }
    PRL_ASSIGN_OR_RETURN(result, std::move(trained));
  }
  if (rank0) AddSampleLags(*samples, state_.weight_version, &out);
  ++state_.step;
  ++state_.weight_version;
  state_.data_position += out.report.groups;
  // Without a journal: acknowledged after training. A lost lease (the step outlived it) means
  // the group will come again: harmless.
  for (const LeasedGroup& g : leased) replay_->Ack(g).IgnoreError();
  const auto publish_start = std::chrono::steady_clock::now();
  if (replaying && state_.step == replay_through_) PRL_RETURN_IF_ERROR(NumberAboveTransport());
  if (!replaying || state_.step == replay_through_) {
    if (!skip_publish_) PRL_RETURN_IF_ERROR(Publish());
    skip_publish_ = false;
  }
  out.report.publish_seconds = SecondsSince(publish_start);
  PRL_ASSIGN_OR_RETURN(
      const bool saved,
      checkpointer_.AfterStep(state_, *model_, *optimizer_, [&](const std::string& dir) {
        // Rank 0's ledger: the lineage's prompts, written with the checkpoint.
        return intake_->admission().ledger().Write(dir + "/" + PromptLedger::kFileName);
      }));
  if (saved && rank0) PRL_RETURN_IF_ERROR(intake_->Checkpointed(state_.step));
  if (rank0) {
    SetStepResult(result, options_.lr, &out.report);
    out.report.step = state_.step;
    out.report.version = state_.weight_version;
    out.report.unix_time = absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch());
    StepReport& r = out.report;
    const GroupAdmission& admission = intake_->admission();
    const int64_t stale_requeued = admission.stale_requeued();
    r.dropped_stale_total =
        replay_->Stats().dropped_stale + admission.stale_dropped() + stale_requeued;
    r.duplicate_groups_total = admission.duplicate_groups();
    r.dropped_uniform_total = intake_->dropped_uniform();
    r.stale_requeued_total = stale_requeued;
    r.dropped_stale = r.dropped_stale_total - reported_.dropped_stale_total;
    r.duplicate_groups = r.duplicate_groups_total - reported_.duplicate_groups_total;
    r.dropped_uniform = r.dropped_uniform_total - reported_.dropped_uniform_total;
    r.stale_requeued = r.stale_requeued_total - reported_.stale_requeued_total;
    reported_ = r;
    if (on_step) on_step(out);
    intake_->Reported();
  }
  return true;
}

absl::Status LearnerService::Run(const std::atomic<bool>* stop,
                                 const std::function<void(const LearnerStepReport&)>& on_step) {
  if (options_.batcher != nullptr) member_ = options_.batcher->Join();
  // Leaves the batcher however Run returns (its rounds must not wait for a trainer gone).
  const absl::Cleanup leave = [this] { member_.reset(); };
  {
    std::optional<StepTurns::Turn> turn;
    if (options_.turns != nullptr) turn.emplace(options_.turns->Take());
    PRL_RETURN_IF_ERROR(Resume());
    if (options_.on_started && replay_ != nullptr) {
      options_.on_started(state_.weight_version, state_.data_position);
    }
    // The starting weights go out unless the transport has them (or a replay will publish).
    if (replay_through_ == state_.step && !skip_publish_) PRL_RETURN_IF_ERROR(Publish());
    skip_publish_ = false;
  }
  while (options_.max_steps == 0 || state_.step < options_.max_steps) {
    PRL_ASSIGN_OR_RETURN(const bool stepped, Step(stop, on_step));
    if (!stepped) break;
  }
  return absl::OkStatus();
}

}  // namespace prl::learner
