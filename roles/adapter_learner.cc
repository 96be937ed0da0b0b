#include "roles/adapter_learner.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "checkpoint/hf_model_dir.h"
#include "core/status_macros.h"
#include "core/xxhash_inline.h"
#include "learner/comm_thread.h"
#include "learner/learner_service.h"
#include "learner/step_batcher.h"
#include "learner/step_turns.h"
#include "prl/v1/prompt.grpc.pb.h"
#include "replay/replay_buffer.h"
#include "roles/adapter_segments.h"
#include "roles/learner_rank.h"
#include "roles/learner_role.h"
#include "roles/learner_step_sink.h"
#include "roles/replay_role.h"
#include "roles/role_metrics.h"
#include "rpc/grpc_util.h"
#include "rpc/security.h"
#include "weight_broadcast/grpc_adapter_server.h"
#include "weight_broadcast/shm_transport.h"

namespace prl::roles {

namespace {

namespace v1 = prl::v1;

// The coordinator's side of the fleet: progress reports, hand-backs (thread-safe: a gRPC stub).
using Coordinator = v1::ActorControl::Stub;

// Wakes the fleet's loop when a trainer stepped, so that its report (which frees the adapter's
// lag budget at the coordinator) goes out at once instead of at the next tick: with one adapter
// a tick of 200 ms between reports held the actors back to a third of a LoRA run's samples/s.
class Wakeup {
 public:
  void Notify() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      pending_ = true;
    }
    changed_.notify_all();
  }
  // Returns after `timeout`, or at once when notified since the last wait.
  void WaitFor(absl::Duration timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    changed_.wait_for(lock, absl::ToChronoNanoseconds(timeout), [&] { return pending_; });
    pending_ = false;
  }

 private:
  std::mutex mu_;
  std::condition_variable changed_;
  bool pending_ = false;
};

// One adapter's trainer: its segments, its model on the shared frozen base, its optimizer, and
// a learner service stepping it on a thread of its own.
class AdapterTrainer {
 public:
  static absl::StatusOr<std::unique_ptr<AdapterTrainer>> Start(
      const config::RunConfig& c, const LearnerRank& rank, const ModelConfig& model,
      const v1::AdapterCompletions& adapter, learner::StepTurns* turns, Coordinator* coordinator,
      metrics::AdapterLearnerMetrics* metrics, GrpcAdapterWeightServer* weight_server,
      collective::Communicator* comm, std::shared_ptr<Arena> workspace,
      learner::CommThread* step_thread, learner::StepBatcher* batcher, Wakeup* stepped);
  ~AdapterTrainer() {
    Stop();
    if (report_file_ != nullptr) std::fclose(report_file_);
  }

  void Stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  // Stops it and removes its segments (the adapter was deleted).
  void Remove() {
    Stop();
    service_.reset();
    if (weight_server_ != nullptr) weight_server_->Remove(id_);  // its subscribers stop
    publisher_.reset();
    replay_.reset();
    ReplayBuffer::Remove(replay_segment_, true).IgnoreError();
    if (weight_server_ == nullptr) RemoveShmWeightSegment(weight_segment_).IgnoreError();
  }

  v1::AdapterProgress Progress() const {
    v1::AdapterProgress p;
    p.set_adapter_id(id_);
    p.set_version(version_.load());
    p.set_groups_consumed(consumed_.load());
    const ReplayStats rs = replay_->Stats();  // the backlog: waiting, and taken for a step
    p.set_groups_waiting(rs.groups_ready + rs.groups_leased + service_->groups_in_step());
    if (metrics_ != nullptr) {
      metrics_->Update(name_, [&](const metrics::AdapterLearnerMetrics::Adapter& m) {
        m.groups_waiting.Set(static_cast<double>(p.groups_waiting()));
      });
    }
    return p;
  }
  // The service's end: nullopt while it runs.
  std::optional<absl::Status> Ended() const {
    std::lock_guard<std::mutex> lock(mu_);
    return ended_;
  }
  void AddRetired(const std::vector<std::string>& sets) {
    std::lock_guard<std::mutex> lock(mu_);
    retired_.insert(retired_.end(), sets.begin(), sets.end());
  }
  const std::string& name() const { return name_; }
  // It took its learner.steps steps (and wrote its last checkpoint).
  bool Finished() const {
    const std::optional<absl::Status> ended = Ended();
    return ended.has_value() && ended->ok();
  }

 private:
  AdapterTrainer() = default;
  void Run();

  std::string id_, name_, replay_segment_, weight_segment_;
  std::unique_ptr<learner::FsdpModel> model_;
  std::unique_ptr<learner::ShardedOptimizer> optimizer_;
  std::unique_ptr<ReplayBuffer> replay_;
  GrpcAdapterWeightServer* weight_server_ = nullptr;  // null: versions in weight_segment_
  std::unique_ptr<WeightPublisher> publisher_;
  std::unique_ptr<learner::LearnerService> service_;
  std::atomic<bool> stop_{false};
  std::atomic<int64_t> version_{0}, consumed_{0};
  mutable std::mutex mu_;
  std::optional<absl::Status> ended_;
  std::vector<std::string> retired_;  // prompt sets retired, for the ledger
  std::FILE* report_file_ = nullptr;  // learner.report_file's of this adapter, or null
  metrics::AdapterLearnerMetrics* metrics_ = nullptr;  // its series' owner; null: not exported
  Wakeup* stepped_ = nullptr;                          // told after each step
  std::thread thread_;
};

absl::StatusOr<std::unique_ptr<AdapterTrainer>> AdapterTrainer::Start(
    const config::RunConfig& c, const LearnerRank& rank, const ModelConfig& model,
    const v1::AdapterCompletions& adapter, learner::StepTurns* turns, Coordinator* coordinator,
    metrics::AdapterLearnerMetrics* metrics, GrpcAdapterWeightServer* weight_server,
    collective::Communicator* comm, std::shared_ptr<Arena> workspace,
    learner::CommThread* step_thread, learner::StepBatcher* batcher, Wakeup* stepped) {
  std::unique_ptr<AdapterTrainer> t(new AdapterTrainer());
  t->stepped_ = stepped;
  t->weight_server_ = weight_server;
  t->id_ = adapter.adapter_id();
  t->name_ = adapter.spec().name();
  t->metrics_ = metrics;
  const LoraConfig lora = LoraConfigOf(adapter.spec());
  // The model: this adapter on the node's frozen base (no copy of the base), new as peft makes
  // one (A random, B zero), seeded by its id: the same adapter starts the same after a restart
  // (its checkpoint, if any, then takes over).
  PRL_ASSIGN_OR_RETURN(AdapterModel made,
                       CreateAdapterModel(c.learner, rank, model, lora,
                                          XXH3_64bits(t->id_.data(), t->id_.size()),
                                          adapter.spec().learning_rate(), comm,
                                          std::move(workspace)));
  t->model_ = std::move(made.model);
  t->optimizer_ = std::move(made.optimizer);
  const double lr = adapter.spec().learning_rate();
  // Its segments: joined when they exist (this learner restarted), else made.
  t->replay_segment_ = AdapterReplaySegment(c, t->id_);
  t->weight_segment_ = AdapterWeightSegment(c, t->id_);
  absl::StatusOr<std::unique_ptr<ReplayBuffer>> replay = ReplayBuffer::Open(t->replay_segment_);
  if (absl::IsNotFound(replay.status())) {
    replay = ReplayBuffer::Create(t->replay_segment_, AdapterReplayConfigFrom(c, model));
  }
  PRL_ASSIGN_OR_RETURN(t->replay_, std::move(replay));
  std::string versions_at = t->weight_segment_;
  if (weight_server != nullptr) {  // a channel of the run's weight server, its version kept
    const std::string dir = absl::StrCat(c.checkpoint_dir(), "/adapters/", t->id_);
    std::error_code error;
    std::filesystem::create_directories(dir, error);
    if (error) {
      return absl::FailedPreconditionError(
          absl::StrCat("cannot make the adapter's directory '", dir, "': ", error.message()));
    }
    PRL_ASSIGN_OR_RETURN(t->publisher_, weight_server->Add(t->id_, WeightSpec(model, lora),
                                                           absl::StrCat(dir, "/weight_version")));
    versions_at = absl::StrCat("gRPC port ", weight_server->port(), " (adapter_id ", t->id_, ")");
  } else {
    PRL_ASSIGN_OR_RETURN(t->publisher_,
                         ShmWeightPublisher::Create(t->weight_segment_, WeightSpec(model, lora)));
  }
  learner::LearnerServiceOptions options = LearnerServiceOptionsFrom(c);
  options.step = rank.step;
  options.lr = lr;
  options.turns = turns;
  options.step_thread = step_thread;
  options.batcher = batcher;
  options.checkpoint.dir = absl::StrCat(c.checkpoint_dir(), "/adapters/", t->id_);
  options.dead_letter_path = c.dead_letter_file(absl::StrCat("learner-", t->id_));
  if (coordinator != nullptr) {
    options.reopen_stale = [coordinator](const std::vector<learner::StalePrompt>& prompts) {
      return ReopenPromptsAt(*coordinator, prompts);
    };
  }
  AdapterTrainer* raw = t.get();
  options.retired_prompt_sets = [raw] {
    std::lock_guard<std::mutex> lock(raw->mu_);
    return std::exchange(raw->retired_, {});
  };
  options.on_started = [raw](int64_t version, int64_t consumed) {
    raw->version_ = version;
    raw->consumed_ = consumed;
    if (raw->metrics_ != nullptr) {
      raw->metrics_->Update(raw->name_, [&](const metrics::AdapterLearnerMetrics::Adapter& m) {
        m.version.Set(static_cast<double>(version));
      });
    }
  };
  if (!c.learner.report_file.empty()) {
    const std::string path = AdapterReportFile(c, t->name_);
    t->report_file_ = std::fopen(path.c_str(), "a");
    if (t->report_file_ == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          "learner.report_file: cannot append to '", path, "' (adapter ", t->name_, "'s reports)"));
    }
  }
  t->service_ = std::make_unique<learner::LearnerService>(
      t->model_.get(), t->optimizer_.get(), t->replay_.get(), t->publisher_.get(), options);
  t->thread_ = std::thread([raw] { raw->Run(); });
  std::printf("learner: adapter %s (%s): %s, lr %g; versions in %s, groups from %s\n",
              t->name_.c_str(), t->id_.c_str(), LoraFingerprint(lora).c_str(), lr,
              versions_at.c_str(), t->replay_segment_.c_str());
  std::fflush(stdout);
  return t;
}

void AdapterTrainer::Run() {
  const absl::Status run = service_->Run(&stop_, [this](const learner::LearnerStepReport& step) {
    const learner::StepReport& r = step.report;
    version_ = r.version;
    consumed_ = service_->groups_consumed();
    stepped_->Notify();  // the fleet reports now
    std::printf("adapter %s step %lld: version %lld, %lld groups (%lld samples), reward %.4f, "
                "loss %.4g, lag mean %.2f\n",
                name_.c_str(), static_cast<long long>(r.step), static_cast<long long>(r.version),
                static_cast<long long>(r.groups), static_cast<long long>(r.samples),
                r.mean_reward, r.loss, r.lag_mean);
    std::fflush(stdout);
    if (report_file_ != nullptr) {
      std::fprintf(report_file_, "%s\n", learner::StepReportToJson(r).c_str());
      std::fflush(report_file_);
    }
    if (metrics_ != nullptr) {
      metrics_->Update(name_, [&](const metrics::AdapterLearnerMetrics::Adapter& m) {
        m.steps.Increment();
        m.samples.Increment(static_cast<double>(r.samples));
        m.tokens.Increment(static_cast<double>(r.trained_tokens));
        m.version.Set(static_cast<double>(r.version));
        m.reward_mean.Set(r.mean_reward);
        m.loss.Set(r.loss);
        m.lag_mean_versions.Set(r.lag_mean);
        m.step_seconds.Set(r.step_seconds);
      });
    }
  });
  std::lock_guard<std::mutex> lock(mu_);
  ended_ = run;
}

// The fleet: the trainers by adapter id, and the coordinator's reply they follow.
class AdapterFleet {
 public:
  // `comm`: the trainers' communicator (a world of one: each adapter trains on one rank);
  // `placement`: this rank's index and the learner's ranks (an adapter trains on the rank its
  // AdapterCompletions.learner_rank names, modulo the ranks).
  AdapterFleet(const config::RunConfig& c, const LearnerRank& rank, const ModelConfig& model,
               metrics::AdapterLearnerMetrics* metrics, GrpcAdapterWeightServer* weight_server,
               collective::Communicator* comm, int this_rank, int ranks, Wakeup* wakeup)
      : c_(c),
        rank_(rank),
        model_(model),
        metrics_(metrics),
        weight_server_(weight_server),
        comm_(comm),
        workspace_(std::make_shared<Arena>(rank.device)),
        this_rank_(this_rank),
        ranks_(ranks),
        wakeup_(wakeup) {
    coordinator_ = v1::ActorControl::NewStub(
        rpc::NewChannel(c.coordinator_address(), rpc::ChannelArgs(int64_t{1} << 20)));
    // On the CPU the rank's adapters step together: one set of passes over the base for every
    // adapter whose step is in (learner/step_batcher.h); elsewhere, and with
    // learner.adapter_pass_tokens = 0, in turns.
    if (c.learner.adapter_pass_tokens > 0 && rank.device.is_cpu()) {
      batcher_ = std::make_unique<learner::StepBatcher>(&turns_, c.learner.adapter_pass_tokens);
    } else {
      step_thread_.emplace();
    }
  }
  ~AdapterFleet() {
    for (auto& [id, start] : starting_) {
      absl::StatusOr<std::unique_ptr<AdapterTrainer>> trainer = start.trainer.get();
      if (trainer.ok()) (*trainer)->Stop();
    }
    for (std::future<void>& removal : removing_) removal.wait();
    for (auto& [id, trainer] : trainers_) trainer->Stop();
  }

  // Every adapter named in `names` that this rank trains has a trainer that took its
  // learner.steps steps (each is known: a name not heard of yet is not finished).
  bool Finished(const std::vector<std::string>& names) const {
    for (const std::string& name : names) {
      if (!placed_.contains(name)) return false;  // not made yet
      if (placed_.at(name) != this_rank_) continue;  // another rank's
      const bool done = std::any_of(trainers_.begin(), trainers_.end(), [&](const auto& t) {
        return t.second->name() == name && t.second->Finished();
      });
      if (!done) return false;
    }
    return true;
  }

  // One round: report, then follow the reply (new adapters get trainers, deleted ones are
  // removed). A trainer that fails to start or stops with an error is made again later.
  // Trainers are made and removed off this thread (mapping a replay segment, creating a model
  // or stopping a step in progress can take seconds): the others' reports go on meanwhile. True
  // when the coordinator took the report.
  absl::StatusOr<bool> Round() {
    CollectStarted();
    std::erase_if(removing_, [](std::future<void>& f) {
      return f.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
    });
    // A trainer that failed costs only its adapter: it stops (its segments stay) and is made
    // again after a pause, the others train on.
    for (auto it = trainers_.begin(); it != trainers_.end();) {
      const std::optional<absl::Status> ended = it->second->Ended();
      if (!ended.has_value() || ended->ok()) {
        ++it;
        continue;
      }
      Failed(it->first, it->second->name(), *ended);
      it->second->Stop();
      it = trainers_.erase(it);
    }
    v1::LearnerProgressRequest request;
    for (const auto& [id, trainer] : trainers_) *request.add_adapters() = trainer->Progress();
    if (seen_.has_value()) *request.mutable_seen() = *seen_;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    v1::LearnerProgressResponse reply;
    if (!coordinator_->ReportLearnerProgress(&ctx, request, &reply).ok()) {
      return false;  // the coordinator restarts: the next round reports again
    }
    seen_ = reply;
    const std::vector<std::string> retired(reply.retired_prompt_sets().begin(),
                                           reply.retired_prompt_sets().end());
    std::map<std::string, const v1::AdapterCompletions*> live;
    for (const v1::AdapterCompletions& a : reply.adapter_completions()) live[a.adapter_id()] = &a;
    if (!swept_) {  // the segments of adapters deleted while this learner was down
      std::set<std::string> keep;
      for (const auto& [id, adapter] : live) keep.insert(id);
      RemoveAdapterSegments(c_, keep);
      swept_ = true;
    }
    for (auto it = trainers_.begin(); it != trainers_.end();) {
      if (live.count(it->first) > 0) {
        it->second->AddRetired(retired);
        ++it;
        continue;
      }
      RemoveLater(it->first, std::move(it->second));
      it = trainers_.erase(it);
    }
    live_.clear();
    placed_.clear();
    for (const auto& [id, adapter] : live) {
      placed_[adapter->spec().name()] = adapter->learner_rank() % ranks_;
      if (adapter->learner_rank() % ranks_ == this_rank_) live_.insert(id);  // this rank's
    }
    // Trainers of adapters this rank does not train (none, unless the placement changed): stop,
    // their segments kept for the rank that trains them.
    for (auto it = trainers_.begin(); it != trainers_.end();) {
      if (live_.contains(it->first)) {
        ++it;
        continue;
      }
      it->second->Stop();
      it = trainers_.erase(it);
    }
    std::erase_if(failed_, [&](const auto& f) { return live.count(f.first) == 0; });
    if (metrics_ != nullptr) {  // a deleted adapter's series go
      std::set<std::string> names;
      for (const auto& [id, adapter] : live) names.insert(adapter->spec().name());
      metrics_->Keep(names);
    }
    for (const auto& [id, adapter] : live) {
      if (!live_.contains(id)) continue;  // another rank's
      if (trainers_.count(id) > 0 || starting_.count(id) > 0) continue;
      if (auto f = failed_.find(id); f != failed_.end() && absl::Now() < f->second) continue;
      // With one learner rank the trainers' collectives are local copies (StepTurns), so a
      // trainer may be made while the others step.
      try {
        starting_.emplace(id, Starting{adapter->spec().name(),
                                       std::async(std::launch::async, [this, a = *adapter] {
                                         return StartTrainer(a);
                                       })});
      } catch (const std::system_error& e) {  // no thread to start it on: again later
        Failed(id, adapter->spec().name(), absl::ResourceExhaustedError(e.what()));
      }
    }
    return true;
  }

 private:
  // Trainers made since the last round join the fleet (or, deleted meanwhile, are removed).
  void CollectStarted() {
    for (auto it = starting_.begin(); it != starting_.end();) {
      if (it->second.trainer.wait_for(std::chrono::seconds(0)) != std::future_status::ready) {
        ++it;
        continue;
      }
      absl::StatusOr<std::unique_ptr<AdapterTrainer>> trainer = it->second.trainer.get();
      if (!trainer.ok()) {
        Failed(it->first, it->second.name, trainer.status());
      } else if (live_.count(it->first) == 0) {
        RemoveLater(it->first, *std::move(trainer));
      } else {
        failed_.erase(it->first);
        trainers_[it->first] = *std::move(trainer);
      }
      it = starting_.erase(it);
    }
  }

  // AdapterTrainer::Start on a thread of its own: what it throws (a thread it cannot start)
  // becomes the adapter's error.
  absl::StatusOr<std::unique_ptr<AdapterTrainer>> StartTrainer(const v1::AdapterCompletions& a) {
    try {
      return AdapterTrainer::Start(c_, rank_, model_, a, &turns_, coordinator_.get(), metrics_,
                                   weight_server_, comm_, workspace_,
                                   step_thread_ ? &*step_thread_ : nullptr, batcher_.get(),
                                   wakeup_);
    } catch (const std::exception& e) {
      return absl::InternalError(absl::StrCat("starting its trainer: ", e.what()));
    }
  }

  // A deleted adapter's trainer stops and its segments go, off the reporting thread (or on it,
  // when no thread can be started).
  void RemoveLater(const std::string& id, std::unique_ptr<AdapterTrainer> trainer) {
    std::printf("learner: adapter %s (%s) was deleted: its trainer stops, its segments go\n",
                trainer->name().c_str(), id.c_str());
    std::fflush(stdout);
    std::shared_ptr<AdapterTrainer> shared = std::move(trainer);
    try {
      removing_.push_back(std::async(std::launch::async, [shared] { shared->Remove(); }));
    } catch (const std::system_error&) {
      shared->Remove();
    }
  }

  // Says why an adapter's trainer stopped and when it is made again.
  void Failed(const std::string& id, const std::string& name, const absl::Status& why) {
    std::fprintf(stderr,
                 "learner: adapter %s (%s): %s; its trainer stops, made again in %lld s (the "
                 "other adapters train on)\n",
                 name.c_str(), id.c_str(), std::string(why.message()).c_str(),
                 static_cast<long long>(absl::ToInt64Seconds(kRetryAfter)));
    failed_[id] = absl::Now() + kRetryAfter;
  }
  static constexpr absl::Duration kRetryAfter = absl::Seconds(30);

  const config::RunConfig& c_;
  const LearnerRank& rank_;
  const ModelConfig& model_;
  metrics::AdapterLearnerMetrics* metrics_;  // null: not exported
  GrpcAdapterWeightServer* weight_server_;   // null: each adapter's versions in a segment
  collective::Communicator* comm_;           // the trainers'
  // The trainers' activations: one workspace, since they take turns (turns_); and the one thread
  // their steps run on (one OpenMP team).
  const std::shared_ptr<Arena> workspace_;
  // (in turns only: the step batcher's rounds run on its own thread)
  std::optional<learner::CommThread> step_thread_;
  const int this_rank_, ranks_;
  Wakeup* const wakeup_;  // the trainers tell it when they step
  std::unique_ptr<Coordinator> coordinator_;
  learner::StepTurns turns_;
  // The rank's joint steps (null: in turns); destroyed after the trainers, its members.
  std::unique_ptr<learner::StepBatcher> batcher_;
  std::optional<v1::LearnerProgressResponse> seen_;
  bool swept_ = false;  // the first reply's deleted adapters' segments removed
  std::map<std::string, std::unique_ptr<AdapterTrainer>> trainers_;
  std::map<std::string, absl::Time> failed_;  // adapter id -> when its trainer is made again
  std::set<std::string> live_;                // the adapters of the last reply this rank trains
  std::map<std::string, int> placed_;         // every live adapter's rank, by name
  // Trainers being made (by adapter id) and removed; destroyed first, waiting for them.
  struct Starting {
    std::string name;
    std::future<absl::StatusOr<std::unique_ptr<AdapterTrainer>>> trainer;
  };
  std::map<std::string, Starting> starting_;
  std::vector<std::future<void>> removing_;
};

}  // namespace

absl::Status RunAdapterLearner(const config::RunConfig& c,
                               const collective::RendezvousConfig& rendezvous,
                               const std::atomic<bool>& stop) {
  // Every rank serves /metrics (its adapters' series): rank 0, or each rank on a node of its
  // own, on metrics.listen; another local rank on a free port of the same host.
  config::MetricsSection metrics = c.metrics;
  if (rendezvous.rank > 0 && !rendezvous.file_store_dir.empty()) {
    metrics.listen = absl::StrCat(metrics.listen.substr(0, metrics.listen.rfind(':')), ":0");
  }
  PRL_ASSIGN_OR_RETURN(std::unique_ptr<RoleMetrics> endpoint, StartRoleMetrics(metrics));
  PRL_ASSIGN_OR_RETURN(const ModelConfig model, ReadModelConfig(c.model.path));
  std::optional<ParameterSet> full;  // the base, read once (then mapped: learner/frozen_base.h)
  auto load = [&]() -> absl::StatusOr<const ParameterSet*> {
    if (!full.has_value()) {
      PRL_ASSIGN_OR_RETURN(full, LoadModel(c.model.path, Device::Cpu()));
    }
    return &*full;
  };
  LearnerRankOptions rank_options;
  rank_options.temperature = static_cast<float>(c.task.temperature);
  // The rank: its communicator, the frozen base mapped once, the step and optimizer settings
  // (its own model of learner.lora_*'s adapter is not trained).
  PRL_ASSIGN_OR_RETURN(std::unique_ptr<LearnerRank> rank,
                       CreateLearnerRank(c.learner, rank_options, model, load, rendezvous));
  full.reset();
  // Each adapter trains on one rank (the rank the coordinator placed it on): the trainers step
  // over a world of one, the ranks sharing only the node's base file.
  collective::Communicator* trainer_comm = rank->comm.get();
  std::unique_ptr<collective::Communicator> own_comm;
  if (rank->comm->world_size() > 1) {
    PRL_ASSIGN_OR_RETURN(own_comm, ConnectRankAlone(rendezvous, "adapters",
                                                    absl::Seconds(c.learner.timeout_s)));
    trainer_comm = own_comm.get();
  }
  std::printf("learner: a run of adapters on %s (rank %d of %d: the adapters placed on it), one "
              "trainer per adapter on a frozen base; coordinator %s%s\n",
              rank->device.ToString().c_str(), rank->rank(), rank->comm->world_size(),
              c.coordinator_address().c_str(), endpoint->Describe().c_str());
  std::fflush(stdout);
  // Across nodes: every adapter's versions on one weight server (outliving the trainers).
  std::unique_ptr<GrpcAdapterWeightServer> weight_server;
  if (c.broadcast.transport == config::WeightTransport::kGrpc) {
    GrpcPublisherOptions options;
    options.address = c.broadcast.listen;
    options.stall_timeout = absl::Seconds(c.broadcast.timeout_s);
    PRL_ASSIGN_OR_RETURN_IN(weight_server, GrpcAdapterWeightServer::Start(options),
                            "broadcast.listen");
    std::printf("learner: every adapter's versions served on gRPC port %d\n",
                weight_server->port());
    std::fflush(stdout);
  }
  endpoint->SetReadiness([] { return absl::OkStatus(); });
  metrics::AdapterLearnerMetrics adapter_metrics(*endpoint->registry);
  Wakeup wakeup;
  AdapterFleet fleet(c, *rank, model, &adapter_metrics, weight_server.get(), trainer_comm,
                     rank->rank(), rank->comm->world_size(), &wakeup);
  // prl run's tenants (config.tenants): the learner ends once each one's adapter has taken its
  // learner.steps steps, as a run of one model ends after them.
  std::vector<std::string> tenants;
  for (const config::TenantSection& t : c.tenants) tenants.push_back(t.name);
  while (!stop) {
    // Finished before the round: its report then holds every tenant's last version.
    const bool finished = !tenants.empty() && fleet.Finished(tenants);
    PRL_ASSIGN_OR_RETURN(const bool reported, fleet.Round());
    if (finished && reported) {
      std::printf("learner: every tenant's adapter took its %lld steps\n",
                  static_cast<long long>(c.learner.steps));
      std::fflush(stdout);
      break;
    }
    wakeup.WaitFor(absl::Milliseconds(200));  // or at once when a trainer stepped
  }
  endpoint->SetReadiness(nullptr);
  return absl::OkStatus();
}

}  // namespace prl::roles
