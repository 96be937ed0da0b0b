#include "learner/learner_service.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "learner/checkpoint.h"

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

}  // namespace

LearnerService::LearnerService(FsdpModel* model, ShardedOptimizer* optimizer, ReplayBuffer* replay,
                               WeightPublisher* publisher, const LearnerServiceOptions& options)
    : model_(model),
      optimizer_(optimizer),
      replay_(replay),
      publisher_(publisher),
      options_(options) {}

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
    const std::atomic<bool>* stop, std::vector<LeasedGroup>* leased, LearnerStepReport* report) {
  std::vector<TrainSample> samples;
  double reward_sum = 0;
  while (static_cast<int64_t>(leased->size()) < options_.groups_per_step && !stop->load()) {
    TakeOptions take;
    take.max_groups = static_cast<int32_t>(options_.groups_per_step - leased->size());
    take.learner_version = state_.weight_version;
    take.max_lag = options_.max_lag;
    take.timeout = options_.take_timeout;
    PRL_ASSIGN_OR_RETURN(std::vector<LeasedGroup> groups, replay_->Take(take));
    for (LeasedGroup& g : groups) {
      PRL_ASSIGN_OR_RETURN(std::vector<RolloutRecord> records, g.Decode());
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
  report->groups = static_cast<int64_t>(leased->size());
  report->mean_reward = report->samples > 0 ? reward_sum / report->samples : 0.0;
  return samples;
}

absl::Status LearnerService::Run(const std::atomic<bool>* stop,
                                 const std::function<void(const LearnerStepReport&)>& on_step) {
  const bool rank0 = model_->rank() == 0;
  if (!options_.checkpoint_dir.empty()) {
    PRL_ASSIGN_OR_RETURN(const std::optional<TrainingState> resumed,
                         LoadLatestCheckpoint(options_.checkpoint_dir, *model_, *optimizer_));
    if (resumed.has_value()) {
      state_ = {resumed->step, resumed->weight_version, resumed->data_position};
      if (rank0) {
        std::printf("learner: resumed from %s at step %lld (weight version %lld)\n",
                    options_.checkpoint_dir.c_str(), static_cast<long long>(state_.step),
                    static_cast<long long>(state_.weight_version));
        std::fflush(stdout);
      }
    }
  }
  if (options_.published_version >= state_.weight_version) {
    state_.weight_version = options_.published_version + 1;
  }
  PRL_RETURN_IF_ERROR(Publish());
  while (options_.max_steps == 0 || state_.step < options_.max_steps) {
    LearnerStepReport report;
    std::vector<LeasedGroup> leased;
    std::vector<uint8_t> bytes;
    if (rank0) {
      PRL_ASSIGN_OR_RETURN(std::vector<TrainSample> samples, NextSamples(stop, &leased, &report));
      const bool stopping =
          stop->load() && leased.size() < static_cast<size_t>(options_.groups_per_step);
      bytes = Encode(stopping ? nullptr : &samples);
      if (stopping) {
        for (const LeasedGroup& g : leased) replay_->Release(g).IgnoreError();
        leased.clear();
      }
    }
    int64_t size = static_cast<int64_t>(bytes.size());
    PRL_RETURN_IF_ERROR(model_->RunCollective([&](collective::Communicator& c) {
      PRL_RETURN_IF_ERROR(c.BroadcastHost({reinterpret_cast<uint8_t*>(&size), sizeof(size)}, 0));
      bytes.resize(static_cast<size_t>(size));
      return c.BroadcastHost(absl::MakeSpan(bytes), 0);
    }));
    std::optional<std::vector<TrainSample>> samples = Decode(std::move(bytes));
    if (!samples.has_value()) break;  // rank 0 was told to stop
    if (!samples->empty()) {
      PRL_ASSIGN_OR_RETURN(report.result, TrainStep(*model_, *optimizer_, *samples, options_.step,
                                                    state_.weight_version));
    }
    if (rank0) {
      for (const TrainSample& sample : *samples) {
        report.completion_tokens += static_cast<int64_t>(sample.completion.size());
        if (sample.versions.empty()) continue;
        int64_t oldest = sample.versions[0];
        double sum = 0;
        for (int64_t v : sample.versions) {
          oldest = std::min(oldest, v);
          sum += static_cast<double>(v);
        }
        const double version = static_cast<double>(state_.weight_version);
        report.sample_max_lags.push_back(version - static_cast<double>(oldest));
        report.sample_mean_lags.push_back(version - sum / sample.versions.size());
      }
    }
    ++state_.step;
    ++state_.weight_version;
    state_.data_position += report.groups;
    if (rank0) {
      for (const LeasedGroup& g : leased) {
        // A lost lease (the step outlived it) means the group will come again: harmless.
        replay_->Ack(g).IgnoreError();
      }
    }
    const auto publish_start = std::chrono::steady_clock::now();
    PRL_RETURN_IF_ERROR(Publish());
    report.publish_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - publish_start).count();
    const bool last_step = options_.max_steps > 0 && state_.step >= options_.max_steps;
    if (!options_.checkpoint_dir.empty() &&
        (state_.step % options_.checkpoint_every == 0 || last_step)) {
      TrainingState t;
      t.step = state_.step;
      t.weight_version = state_.weight_version;
      t.data_position = state_.data_position;
      PRL_RETURN_IF_ERROR(SaveCheckpoint(options_.checkpoint_dir, *model_, *optimizer_, t));
    }
    if (rank0) {
      report.step = state_.step;
      report.version = state_.weight_version;
      report.lag_mean = report.result.stats.lag_mean;
      report.lag_max = report.result.stats.lag_max;
      report.dropped_stale = replay_->Stats().dropped_stale;
      if (on_step) on_step(report);
    }
  }
  return absl::OkStatus();
}

}  // namespace prl::learner
