#include "learner/learner_service.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "learner/checkpoint.h"
#include "weight_broadcast/versioning.h"

namespace prl::learner {

namespace {

// The step's samples as bytes, for the broadcast from rank 0: a count (-1: stop), then per
// sample its arrays (length-prefixed) and advantage.
class Bytes {
 public:
  template <typename T>
  void Put(const T& v) {
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    data.insert(data.end(), p, p + sizeof(T));
  }
  template <typename T>
  void PutVector(const std::vector<T>& v) {
    Put<int64_t>(static_cast<int64_t>(v.size()));
    const auto* p = reinterpret_cast<const uint8_t*>(v.data());
    data.insert(data.end(), p, p + v.size() * sizeof(T));
  }
  template <typename T>
  T Get() {
    T v;
    std::memcpy(&v, data.data() + at, sizeof(T));
    at += sizeof(T);
    return v;
  }
  template <typename T>
  std::vector<T> GetVector() {
    const auto n = static_cast<size_t>(Get<int64_t>());
    std::vector<T> v(n);
    std::memcpy(v.data(), data.data() + at, n * sizeof(T));
    at += n * sizeof(T);
    return v;
  }
  std::vector<uint8_t> data;
  size_t at = 0;
};

std::vector<uint8_t> Encode(const std::vector<TrainSample>* samples) {
  Bytes b;
  b.Put<int64_t>(samples == nullptr ? -1 : static_cast<int64_t>(samples->size()));
  if (samples == nullptr) return b.data;
  for (const TrainSample& s : *samples) {
    b.PutVector(s.prompt);
    b.PutVector(s.completion);
    b.PutVector(s.behaviour_logprobs);
    b.PutVector(s.versions);
    b.Put(s.advantage);
  }
  return b.data;
}

// nullopt: the stop signal.
std::optional<std::vector<TrainSample>> Decode(std::vector<uint8_t> data) {
  Bytes b;
  b.data = std::move(data);
  const int64_t n = b.Get<int64_t>();
  if (n < 0) return std::nullopt;
  std::vector<TrainSample> samples(static_cast<size_t>(n));
  for (TrainSample& s : samples) {
    s.prompt = b.GetVector<int32_t>();
    s.completion = b.GetVector<int32_t>();
    s.behaviour_logprobs = b.GetVector<float>();
    s.versions = b.GetVector<int64_t>();
    s.advantage = b.Get<double>();
    s.has_advantage = true;
  }
  return samples;
}

// Rank 0's per-sample lags (learner version minus the oldest and the mean token version) and
// the completion tokens of the samples trained on.
void AddSampleLags(absl::Span<const TrainSample> samples, int64_t learner_version,
                   LearnerStepReport* out) {
  const double version = static_cast<double>(learner_version);
  for (const TrainSample& sample : samples) {
    out->report.completion_tokens += static_cast<int64_t>(sample.completion.size());
    out->report.completion_tokens_max =
        std::max(out->report.completion_tokens_max, static_cast<int64_t>(sample.completion.size()));
    if (sample.versions.empty()) continue;
    int64_t oldest = sample.versions[0];
    double sum = 0;
    for (int64_t v : sample.versions) {
      oldest = std::min(oldest, v);
      sum += static_cast<double>(v);
    }
    out->sample_max_lags.push_back(version - static_cast<double>(oldest));
    out->sample_mean_lags.push_back(version - sum / static_cast<double>(sample.versions.size()));
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
      }()),
      quarantine_(ModelLimits{model->config().vocab_size, model->config().max_position_embeddings},
                  options.dead_letter_path, "learner") {
  if (replay != nullptr && options.reopen_stale) {
    hand_back_.emplace(replay, options.reopen_stale, options.reopen_retry);
  }
}

absl::Status LearnerService::Publish() {
  // Every rank takes part in the gather; rank 0 publishes. The full copy is allocated once.
  if (!full_.has_value()) {
    PRL_ASSIGN_OR_RETURN(full_, ParameterSet::Allocate(model_->config(), Device::Cpu(), false));
  }
  PRL_RETURN_IF_ERROR(
      model_->GatherFullParams({full_->data(), static_cast<size_t>(full_->layout.num_elements())}));
  if (publisher_ == nullptr) return absl::OkStatus();
  return publisher_->Publish(state_.weight_version, *full_);
}

absl::StatusOr<std::vector<TrainSample>> LearnerService::NextSamples(
    const std::atomic<bool>* stop, std::vector<LeasedGroup>* leased, StepReport* report) {
  std::vector<TrainSample> samples;
  double reward_sum = 0;
  while (static_cast<int64_t>(leased->size()) < options_.groups_per_step && !stop->load()) {
    if (hand_back_.has_value()) hand_back_->Offer();
    TakeOptions take;
    take.max_groups = static_cast<int32_t>(options_.groups_per_step - leased->size());
    take.learner_version = state_.weight_version;
    // With the coordinator to hand them back to, stale groups come here (Admit) rather than
    // being dropped by the buffer.
    take.max_lag = options_.reopen_stale ? INT64_MAX : options_.max_lag;
    take.timeout = options_.take_timeout;
    take.reclaim_first = !took_since_resume_;  // what a dead predecessor held comes first
    took_since_resume_ = true;
    PRL_ASSIGN_OR_RETURN(std::vector<LeasedGroup> groups, replay_->Take(take));
    for (LeasedGroup& g : groups) {
      if (replayed_keys_.erase(g.group_key) > 0) {
        // Journaled and trained by the learner this one replaced, which died before its Ack.
        replay_->Ack(g).IgnoreError();
        continue;
      }
      // Quarantine: a group the model cannot take is dead-lettered, never trained; its prompt
      // is handed back to be generated again (the coordinator counts the attempt and fails
      // the prompt visibly after its last), as a stale group's is.
      std::optional<Quarantine::RefusedPrompt> refused;
      std::optional<std::vector<RolloutRecord>> admitted =
          quarantine_.Admit(g, state_.weight_version, &refused);
      if (!admitted.has_value()) {
        if (refused.has_value() && hand_back_.has_value()) {
          hand_back_->Hold(g,
                           StalePrompt{refused->prompt_set_id, refused->prompt_index,
                                       absl::StrCat("quarantined: ", refused->problem)},
                           /*quarantined=*/true);
        } else {
          replay_->Ack(g).IgnoreError();  // a lost lease brings it back, to be refused again
        }
        continue;
      }
      std::vector<RolloutRecord> records = std::move(*admitted);
      if (!Admit(g, records)) continue;
      std::vector<double> rewards;
      std::vector<std::string> ids(records.size(), "g");
      for (const RolloutRecord& r : records) rewards.push_back(r.reward);
      PRL_ASSIGN_OR_RETURN(const Advantages adv,
                           GroupAdvantages(rewards, ids, options_.advantages));
      for (size_t i = 0; i < records.size(); ++i) {
        RolloutRecord& r = records[i];
        reward_sum += r.reward;
        ++report->samples;
        if (!adv.kept[i] || r.completion_tokens.empty()) continue;
        TrainSample s;
        s.prompt = std::move(r.prompt_tokens);
        s.completion = std::move(r.completion_tokens);
        s.behaviour_logprobs = std::move(r.behaviour_logprobs);
        s.versions = std::move(r.token_versions);
        s.advantage = adv.advantage[i];
        s.has_advantage = true;
        samples.push_back(std::move(s));
      }
      leased->push_back(std::move(g));
    }
  }
  if (hand_back_.has_value()) hand_back_->Offer();  // what this step's takes held back
  report->groups = static_cast<int64_t>(leased->size());
  report->mean_reward = report->samples > 0 ? reward_sum / report->samples : 0.0;
  return samples;
}

bool LearnerService::Admit(LeasedGroup& group, const std::vector<RolloutRecord>& records) {
  const std::string key =
      records.empty() ? "" : PromptLedger::Key(records[0].prompt_set_id, records[0].prompt_index);
  const bool in_step = !key.empty() && std::find(step_prompts_.begin(), step_prompts_.end(), key) !=
                                           step_prompts_.end();
  if (!key.empty() && (ledger_.Contains(key) || in_step)) {
    replay_->Ack(group).IgnoreError();  // a second group of a trained prompt: never trained
    ++duplicate_groups_;
    return false;
  }
  const int64_t lag = state_.weight_version - group.min_version;
  if (hand_back_.has_value() && lag > options_.max_lag) {
    if (key.empty()) {  // no prompt to hand back: dropped, as the buffer would have
      replay_->Ack(group).IgnoreError();
      ++stale_dropped_;
      return false;
    }
    hand_back_->Hold(
        group,
        StalePrompt{records[0].prompt_set_id, records[0].prompt_index,
                    absl::StrCat("stale: generated from weight version ", group.min_version, ", ",
                                 lag, " versions behind the learner's ", state_.weight_version,
                                 " (learner.max_lag ", options_.max_lag, ")")},
        /*quarantined=*/false);
    return false;
  }
  if (!key.empty()) step_prompts_.push_back(key);
  return true;
}

absl::StatusOr<std::optional<std::vector<TrainSample>>> LearnerService::ShareSamples(
    std::vector<uint8_t> bytes) {
  int64_t size = static_cast<int64_t>(bytes.size());
  PRL_RETURN_IF_ERROR(model_->RunCollective([&](collective::Communicator& c) {
    PRL_RETURN_IF_ERROR(c.BroadcastHost({reinterpret_cast<uint8_t*>(&size), sizeof(size)}, 0));
    bytes.resize(static_cast<size_t>(size));
    return c.BroadcastHost(absl::MakeSpan(bytes), 0);
  }));
  return Decode(std::move(bytes));
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
  if (rank0 && !checkpointer_.policy().dir.empty()) {
    PRL_ASSIGN_OR_RETURN(journal_, StepJournal::Open(checkpointer_.policy().dir + "/journal"));
    PRL_ASSIGN_OR_RETURN(to_replay_, journal_->StepsAfter(state_.step));
    replay_steps = static_cast<int64_t>(to_replay_.size());
    if (resumed.has_value()) {
      PRL_ASSIGN_OR_RETURN(
          ledger_, PromptLedger::Read(CheckpointStepDir(checkpointer_.policy().dir, state_.step) +
                                      "/" + PromptLedger::kFileName));
    }
    for (const JournaledStep& j : to_replay_) {
      replayed_keys_.insert(j.group_keys.begin(), j.group_keys.end());
      for (const std::string& key : j.prompt_keys) ledger_.Add(j.step, key);
    }
    if (replay_steps > 0) {
      std::printf("learner: replaying steps %lld..%lld from the journal %s\n",
                  static_cast<long long>(state_.step + 1),
                  static_cast<long long>(state_.step + replay_steps), journal_->dir().c_str());
    }
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

absl::StatusOr<std::vector<uint8_t>> LearnerService::NextStepBytes(const std::atomic<bool>* stop,
                                                                   std::vector<LeasedGroup>* leased,
                                                                   StepReport* report) {
  if (state_.step < replay_through_) {
    JournaledStep j = std::move(to_replay_.front());
    to_replay_.erase(to_replay_.begin());
    report->groups = j.groups;
    report->samples = j.samples;
    report->mean_reward = j.mean_reward;
    return std::move(j.payload);
  }
  if (options_.retired_prompt_sets) {  // the ledger holds the live sets' prompts only
    for (const std::string& id : options_.retired_prompt_sets()) ledger_.ForgetSet(id);
  }
  PRL_ASSIGN_OR_RETURN(const std::vector<TrainSample> taken, NextSamples(stop, leased, report));
  if (stop->load() && leased->size() < static_cast<size_t>(options_.groups_per_step)) {
    for (const LeasedGroup& g : *leased) replay_->Release(g).IgnoreError();
    leased->clear();
    step_prompts_.clear();
    return Encode(nullptr);
  }
  std::vector<uint8_t> bytes = Encode(&taken);
  std::vector<std::string> prompts = std::move(step_prompts_);
  step_prompts_.clear();
  if (!journal_.has_value()) {
    for (const std::string& key : prompts) ledger_.Add(state_.step + 1, key);
    return bytes;
  }
  JournaledStep j{
      state_.step + 1, report->groups, report->samples, report->mean_reward, {}, {}, bytes};
  for (const LeasedGroup& g : *leased) j.group_keys.push_back(g.group_key);
  j.prompt_keys = std::move(prompts);
  PRL_RETURN_IF_ERROR(journal_->Append(j));
  for (const std::string& key : j.prompt_keys) ledger_.Add(j.step, key);
  groups_in_step_ = static_cast<int64_t>(leased->size());  // before they leave the buffer
  // On disk now: the buffer may let go of them.
  for (const LeasedGroup& g : *leased) replay_->Ack(g).IgnoreError();
  leased->clear();
  return bytes;
}

absl::StatusOr<bool> LearnerService::Step(
    const std::atomic<bool>* stop, const std::function<void(const LearnerStepReport&)>& on_step) {
  const bool rank0 = model_->rank() == 0;
  const bool replaying = state_.step < replay_through_;
  LearnerStepReport out;
  std::vector<LeasedGroup> leased;
  std::vector<uint8_t> bytes;
  if (rank0) {
    PRL_ASSIGN_OR_RETURN(bytes, NextStepBytes(stop, &leased, &out.report));
    groups_in_step_ = out.report.groups;  // the step's, until it is reported
  }
  PRL_ASSIGN_OR_RETURN(std::optional<std::vector<TrainSample>> samples,
                       ShareSamples(std::move(bytes)));
  if (!samples.has_value()) return false;  // rank 0 was told to stop
  StepResult result;
  if (!samples->empty()) {
    PRL_ASSIGN_OR_RETURN(
        result, TrainStep(*model_, *optimizer_, *samples, options_.step, state_.weight_version));
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
        return ledger_.Write(dir + "/" + PromptLedger::kFileName);  // rank 0's: the lineage's
      }));
  if (saved && journal_.has_value()) PRL_RETURN_IF_ERROR(journal_->DropThrough(state_.step));
  if (rank0) {
    SetStepResult(result, options_.lr, &out.report);
    out.report.step = state_.step;
    out.report.version = state_.weight_version;
    out.report.unix_time = absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch());
    StepReport& r = out.report;
    const int64_t stale_requeued = hand_back_.has_value() ? hand_back_->stale_requeued() : 0;
    r.dropped_stale_total = replay_->Stats().dropped_stale + stale_dropped_ + stale_requeued;
    r.duplicate_groups_total = duplicate_groups_;
    r.stale_requeued_total = stale_requeued;
    r.dropped_stale = r.dropped_stale_total - reported_.dropped_stale_total;
    r.duplicate_groups = r.duplicate_groups_total - reported_.duplicate_groups_total;
    r.stale_requeued = r.stale_requeued_total - reported_.stale_requeued_total;
    reported_ = r;
    if (on_step) on_step(out);
    groups_in_step_ = 0;
  }
  return true;
}

absl::Status LearnerService::Run(const std::atomic<bool>* stop,
                                 const std::function<void(const LearnerStepReport&)>& on_step) {
  PRL_RETURN_IF_ERROR(Resume());
  // The starting weights go out unless the transport has them (or a replay will publish).
  if (replay_through_ == state_.step && !skip_publish_) PRL_RETURN_IF_ERROR(Publish());
  skip_publish_ = false;
  while (options_.max_steps == 0 || state_.step < options_.max_steps) {
    PRL_ASSIGN_OR_RETURN(const bool stepped, Step(stop, on_step));
    if (!stepped) break;
  }
  return absl::OkStatus();
}

}  // namespace prl::learner
