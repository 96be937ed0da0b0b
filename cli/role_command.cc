// The pipeline's worker roles as processes: `prl actor` and `prl learner serve`. (The third
// role, `prl coordinator`, is in service_command.cc.)
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "actor/actor.h"
#include "checkpoint/hf_model_dir.h"
#include "cli/command.h"
#include "cli/config_flags.h"
#include "collective/rendezvous.h"
#include "core/status_macros.h"
#include "learner/learner_service.h"
#include "learner/local_launcher.h"
#include "metrics/metrics_server.h"
#include "metrics/prl_metrics.h"
#include "nlohmann/json.hpp"
#include "prl/v1/prompt.grpc.pb.h"
#include "rpc/grpc_util.h"
#include "task/char_tokenizer.h"
#include "weight_broadcast/grpc_transport.h"
#include "weight_broadcast/shm_transport.h"

namespace prl::cli {

namespace {

std::atomic<bool> stop_requested{false};

void StopOnSignals() {
  std::signal(SIGINT, [](int) { stop_requested = true; });
  std::signal(SIGTERM, [](int) { stop_requested = true; });
}

struct ActorFlags {
  std::string coordinator = "localhost:50051", model, replay, replay_address, weights;
  std::string weights_address, metrics_address, config_file;
  actor::ActorOptions options;
  int64_t kv_cache_mb = 256;
  double replay_timeout_s = 60;
  bool char_tokenizer = false;
  CLI::App* command = nullptr;
};

absl::Status ApplyConfig(ActorFlags& f) {
  if (f.config_file.empty()) return absl::OkStatus();
  PRL_ASSIGN_OR_RETURN(const config::RunConfig c, config::LoadRunConfig(f.config_file));
  CLI::App* cmd = f.command;
  FromConfig(cmd, "--model", &f.model, c.model.path);
  FromConfig(cmd, "--coordinator", &f.coordinator, c.coordinator.address);
  if (cmd->get_option("--replay-address")->count() == 0) {
    FromConfig(cmd, "--replay", &f.replay, c.replay_segment());
  }
  if (c.broadcast.transport == "shm" && cmd->get_option("--weights-address")->count() == 0) {
    FromConfig(cmd, "--weights", &f.weights, c.weight_segment());
  }
  FromConfig(cmd, "--run-id", &f.options.run_id, c.run.name);
  FromConfig(cmd, "--max-prompts-in-flight", &f.options.max_prompts_in_flight,
             c.actors.max_prompts_in_flight);
  FromConfig(cmd, "--max-num-seqs", &f.options.engine.max_num_seqs, c.actors.max_num_seqs);
  FromConfig(cmd, "--kv-cache-mb", &f.kv_cache_mb, c.actors.kv_cache_mb);
  FromConfig(cmd, "--char-tokenizer", &f.char_tokenizer, c.task.name == "arithmetic");
  return absl::OkStatus();
}

absl::Status RunActor(ActorFlags f) {
  PRL_RETURN_IF_ERROR(ApplyConfig(f));
  if (f.model.empty()) {
    return absl::InvalidArgumentError("actor: --model is required (or --config with model.path)");
  }
  if (!f.weights.empty() && !f.weights_address.empty()) {
    return absl::InvalidArgumentError(
        "actor: give at most one of --weights (shared memory) and --weights-address (gRPC)");
  }
  if (f.replay.empty() == f.replay_address.empty()) {
    return absl::InvalidArgumentError(
        "actor: give exactly one of --replay (a local segment) and --replay-address (a remote "
        "ingest)");
  }
  PRL_ASSIGN_OR_RETURN(ParameterSet loaded, LoadModel(f.model, Device::Cpu()));
  const ModelConfig config = loaded.config;
  auto initial = std::make_shared<const ParameterSet>(std::move(loaded));
  f.options.coordinator = f.coordinator;
  f.options.engine.kv_cache_bytes = f.kv_cache_mb << 20;
  if (f.char_tokenizer) {
    f.options.decode = [](absl::Span<const int32_t> ids) {
      return task::CharTokenizer().Decode(ids);
    };
  }
  StopOnSignals();
  std::unique_ptr<ReplayBuffer> buffer;
  actor::GroupWriter writer;
  const absl::Duration timeout = absl::Seconds(f.replay_timeout_s);
  if (!f.replay.empty()) {
    // The learner creates the segment; an actor started first waits for it.
    absl::StatusOr<std::unique_ptr<ReplayBuffer>> opened = ReplayBuffer::Open(f.replay);
    for (int i = 0; i < 600 && absl::IsNotFound(opened.status()) && !stop_requested; ++i) {
      absl::SleepFor(absl::Milliseconds(100));
      opened = ReplayBuffer::Open(f.replay);
    }
    PRL_RETURN_IF_ERROR(opened.status());
    buffer = std::move(*opened);
    writer = actor::LocalReplayWriter(buffer.get(), timeout);
  } else {
    PRL_ASSIGN_OR_RETURN(writer, actor::RemoteReplayWriter(f.replay_address, timeout));
  }
  std::unique_ptr<WeightSubscriber> weights;
  if (!f.weights.empty()) {
    ShmSubscriberOptions options;
    options.open_timeout = absl::Seconds(60);  // the learner may start after us
    PRL_ASSIGN_OR_RETURN(weights, ShmWeightSubscriber::Open(f.weights, config, options));
  } else if (!f.weights_address.empty()) {
    PRL_ASSIGN_OR_RETURN(weights, GrpcWeightSubscriber::Connect(f.weights_address, config));
  }
  auto registry = std::make_shared<prometheus::Registry>();
  metrics::ProcessMetrics process_metrics(*registry, metrics::Role::kActor);
  metrics::ActorMetrics actor_metrics(*registry);
  metrics::WeightSyncMetrics weight_metrics(*registry);
  std::unique_ptr<metrics::MetricsServer> metrics_server;
  if (!f.metrics_address.empty()) {
    metrics::MetricsServerOptions metrics_options;
    metrics_options.address = f.metrics_address;
    PRL_ASSIGN_OR_RETURN(metrics_server, metrics::MetricsServer::Start(metrics_options, registry));
    f.options.metrics = &actor_metrics;
    f.options.weight_metrics = &weight_metrics;
    f.options.process_metrics = &process_metrics;
  }
  PRL_ASSIGN_OR_RETURN(
      auto a, actor::Actor::Create(initial, 0, std::move(writer), weights.get(), f.options));
  std::printf("actor %s: generating for %s%s\n", f.options.name.c_str(), f.coordinator.c_str(),
              metrics_server != nullptr
                  ? absl::StrCat(" (metrics on port ", metrics_server->port(), ")").c_str()
                  : "");
  std::fflush(stdout);
  StopOnSignals();
  const absl::Status run = a->Run(&stop_requested);
  const actor::ActorStats s = a->stats();
  std::printf("actor %s: %lld groups, %lld tokens, %lld reward failures, weight version %lld\n",
              f.options.name.c_str(), static_cast<long long>(s.groups_written),
              static_cast<long long>(s.tokens_generated), static_cast<long long>(s.reward_failures),
              static_cast<long long>(s.weight_version));
  return run;
}

struct ServeFlags {
  std::string model, replay = "prl-replay", weights = "prl-weights", coordinator;
  std::string weights_listen, metrics_address, report_file, config_file;
  CLI::App* command = nullptr;
  int world_size = 1;
  int64_t replay_mb = 256;
  double timeout_s = 300;
  std::string loss = "reinforce_tis", optimizer = "adamw", advantage = "grpo";
  double lr = 1e-5, max_grad_norm = 1.0, temperature = 1.0;
  learner::LearnerServiceOptions options;
  std::vector<std::string> argv;
};

absl::Status ApplyConfig(ServeFlags& f) {
  if (f.config_file.empty()) return absl::OkStatus();
  PRL_ASSIGN_OR_RETURN(const config::RunConfig c, config::LoadRunConfig(f.config_file));
  CLI::App* cmd = f.command;
  FromConfig(cmd, "--model", &f.model, c.model.path);
  FromConfig(cmd, "--replay", &f.replay, c.replay_segment());
  FromConfig(cmd, "--replay-mb", &f.replay_mb, c.replay.capacity_mb);
  if (c.broadcast.transport == "shm" && cmd->get_option("--weights-listen")->count() == 0) {
    FromConfig(cmd, "--weights", &f.weights, c.weight_segment());
  }
  FromConfig(cmd, "--coordinator", &f.coordinator, c.coordinator.address);
  FromConfig(cmd, "--world-size", &f.world_size, c.learner.world_size);
  FromConfig(cmd, "--groups-per-step", &f.options.groups_per_step, c.learner.groups_per_step);
  FromConfig(cmd, "--max-lag", &f.options.max_lag, c.learner.max_lag);
  FromConfig(cmd, "--max-steps", &f.options.max_steps, c.learner.steps);
  FromConfig(cmd, "--checkpoint-dir", &f.options.checkpoint_dir, c.checkpoint_dir());
  FromConfig(cmd, "--checkpoint-every", &f.options.checkpoint_every, c.learner.checkpoint_every);
  FromConfig(cmd, "--loss", &f.loss, c.learner.loss);
  FromConfig(cmd, "--optimizer", &f.optimizer, c.learner.optimizer);
  FromConfig(cmd, "--lr", &f.lr, c.learner.lr);
  FromConfig(cmd, "--max-grad-norm", &f.max_grad_norm, c.learner.max_grad_norm);
  FromConfig(cmd, "--temperature", &f.temperature, c.task.temperature);
  FromConfig(cmd, "--advantage", &f.advantage, c.learner.advantage);
  FromConfig(cmd, "--micro-batch-tokens", &f.options.step.micro_batch_tokens,
             c.learner.micro_batch_tokens);
  return absl::OkStatus();
}

// One JSON line per step for supervisors and dashboards (prl run tails it).
std::string StepReportJson(const learner::LearnerStepReport& r) {
  const learner::LossStats& l = r.result.stats.loss;
  nlohmann::ordered_json j;
  j["step"] = r.step;
  j["version"] = r.version;
  j["unix_time"] = absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch());
  j["groups"] = r.groups;
  j["samples"] = r.samples;
  j["mean_reward"] = r.mean_reward;
  j["loss"] = l.loss;
  j["mean_ratio"] = l.mean_ratio();
  j["max_ratio"] = l.ratio_max;
  j["clipped_fraction"] = l.clipped_fraction();
  j["kl_behaviour_learner"] = l.kl();
  j["lag_mean"] = r.lag_mean;
  j["lag_max"] = r.lag_max;
  j["trained_tokens"] = l.tokens;
  j["input_tokens"] = r.result.stats.input_tokens;
  j["completion_tokens"] = r.completion_tokens;
  j["step_seconds"] = r.result.stats.seconds;
  j["publish_seconds"] = r.publish_seconds;
  j["dropped_stale"] = r.dropped_stale;
  return j.dump();
}

void ObserveStep(const learner::LearnerStepReport& r, metrics::LearnerMetrics& m,
                 metrics::WeightSyncMetrics& w, metrics::ProcessMetrics& p, double lr) {
  const learner::LossStats& l = r.result.stats.loss;
  m.step_seconds.Observe(r.result.stats.seconds);
  m.steps.Increment();
  m.tokens.Increment(static_cast<double>(l.tokens));
  m.samples.Increment(static_cast<double>(r.samples));
  for (double lag : r.sample_max_lags) m.sample_max_lag_versions.Observe(lag);
  for (double lag : r.sample_mean_lags) m.sample_mean_lag_versions.Observe(lag);
  m.step_max_lag_versions.Set(r.lag_max);
  m.loss.Set(l.loss);
  m.importance_ratio_mean.Set(l.mean_ratio());
  m.importance_ratio_max.Set(l.ratio_max);
  m.clipped_tokens_ratio.Set(l.clipped_fraction());
  m.importance_weight_ess_ratio.Set(l.effective_sample_size());
  m.logprob_mismatch_kl.Set(l.kl());
  m.entropy.Set(l.entropy());
  m.grad_norm.Set(r.result.optimizer.grad_norm);
  m.learning_rate.Set(lr);
  w.publish_seconds.Observe(r.publish_seconds);
  p.weight_version.Set(static_cast<double>(r.version));
}

absl::Status ServeRank(const ServeFlags& f, const collective::RendezvousConfig& rendezvous) {
  const bool rank0 = rendezvous.rank == 0;
  PRL_ASSIGN_OR_RETURN(ParameterSet full, LoadModel(f.model, Device::Cpu()));
  learner::LearnerServiceOptions options = f.options;
  PRL_ASSIGN_OR_RETURN(options.step.loss.kind, learner::ParseLossKind(f.loss));
  options.step.temperature = static_cast<float>(f.temperature);
  options.advantages.scale_by_std = f.advantage != "dr_grpo";
  learner::OptimizerConfig opt;
  PRL_ASSIGN_OR_RETURN(opt.kind, learner::ParseOptimizerKind(f.optimizer));
  opt.lr = f.lr;
  opt.max_grad_norm = f.max_grad_norm;

  // Rank 0 owns the node's replay segment and the weights segment.
  std::unique_ptr<ReplayBuffer> replay;
  std::unique_ptr<WeightPublisher> publisher;
  if (rank0) {
    ReplayConfig rc;
    rc.capacity_bytes = f.replay_mb << 20;
    rc.label = "prl learner serve";
    // A segment that exists (this learner restarted; the actors still write into it) is
    // joined, so that nothing generated is lost; otherwise it is created.
    absl::StatusOr<std::unique_ptr<ReplayBuffer>> created = ReplayBuffer::Open(f.replay);
    if (absl::IsNotFound(created.status())) created = ReplayBuffer::Create(f.replay, rc);
    PRL_RETURN_IF_ERROR(created.status());
    replay = std::move(*created);
    if (f.weights_listen.empty()) {
      PRL_ASSIGN_OR_RETURN(publisher, ShmWeightPublisher::Create(f.weights, full.config));
      PRL_ASSIGN_OR_RETURN(const ShmSegmentInfo info, InspectShmWeightSegment(f.weights));
      options.published_version = info.newest_version;
    } else {
      GrpcPublisherOptions grpc_options;
      grpc_options.address = f.weights_listen;
      PRL_ASSIGN_OR_RETURN(auto grpc_publisher,
                           GrpcWeightPublisher::Start(full.config, grpc_options));
      std::printf("learner: publishing weights over gRPC on port %d\n", grpc_publisher->port());
      publisher = std::move(grpc_publisher);
    }
  }
  auto registry = std::make_shared<prometheus::Registry>();
  metrics::ProcessMetrics process_metrics(*registry, metrics::Role::kLearner);
  metrics::LearnerMetrics learner_metrics(*registry, f.loss);
  metrics::WeightSyncMetrics weight_metrics(*registry);
  metrics::ReplayMetrics replay_metrics(*registry);
  std::unique_ptr<metrics::MetricsServer> metrics_server;
  if (rank0 && !f.metrics_address.empty()) {
    metrics::MetricsServerOptions metrics_options;
    metrics_options.address = f.metrics_address;
    PRL_ASSIGN_OR_RETURN(metrics_server, metrics::MetricsServer::Start(metrics_options, registry));
    std::printf("learner: metrics on port %d\n", metrics_server->port());
  }
  std::FILE* report_file = nullptr;
  if (rank0 && !f.report_file.empty()) {
    report_file = std::fopen(f.report_file.c_str(), "a");
    if (report_file == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("--report-file: cannot append to '", f.report_file, "'"));
    }
  }
  std::fflush(stdout);
  collective::CommunicatorOptions comm_options;
  comm_options.timeout = absl::Seconds(f.timeout_s);
  PRL_ASSIGN_OR_RETURN(auto comm, collective::ConnectGloo(rendezvous, comm_options));
  PRL_ASSIGN_OR_RETURN(auto model, learner::FsdpModel::Create(full.config, comm.get(), {}));
  PRL_RETURN_IF_ERROR(
      model->LoadFull({full.data(), static_cast<size_t>(full.layout.num_elements())}));
  PRL_ASSIGN_OR_RETURN(auto optimizer, learner::ShardedOptimizer::Create(opt, model.get()));
  learner::LearnerService service(model.get(), optimizer.get(), replay.get(), publisher.get(),
                                  options);
  std::unique_ptr<prl::v1::ActorControl::Stub> control;
  if (rank0 && !f.coordinator.empty()) {
    control = prl::v1::ActorControl::NewStub(
        grpc::CreateChannel(f.coordinator, grpc::InsecureChannelCredentials()));
  }
  StopOnSignals();
  return service.Run(&stop_requested, [&](const learner::LearnerStepReport& r) {
    const learner::LossStats& l = r.result.stats.loss;
    std::printf(
        "step %lld: version %lld, %lld groups (%lld samples), reward %.4f, loss %.4g, ratio "
        "%.3f, lag mean %.2f max %.0f, %.0f tok/s, dropped stale %lld\n",
        static_cast<long long>(r.step), static_cast<long long>(r.version),
        static_cast<long long>(r.groups), static_cast<long long>(r.samples), r.mean_reward, l.loss,
        l.mean_ratio(), r.lag_mean, r.lag_max,
        r.result.stats.seconds > 0 ? r.result.stats.input_tokens / r.result.stats.seconds : 0.0,
        static_cast<long long>(r.dropped_stale));
    std::fflush(stdout);
    if (metrics_server != nullptr) {
      ObserveStep(r, learner_metrics, weight_metrics, process_metrics, f.lr);
      const ReplayStats rs = replay->Stats();
      replay_metrics.used_bytes.Set(static_cast<double>(rs.used_bytes));
      replay_metrics.capacity_bytes.Set(static_cast<double>(rs.capacity_bytes));
      replay_metrics.groups_ready.Set(static_cast<double>(rs.groups_ready));
      replay_metrics.groups_leased.Set(static_cast<double>(rs.groups_leased));
      metrics::AdvanceCounterTo(replay_metrics.groups_written, static_cast<double>(rs.groups_in));
      metrics::AdvanceCounterTo(replay_metrics.bytes_written, static_cast<double>(rs.bytes_in));
      metrics::AdvanceCounterTo(replay_metrics.groups_redelivered,
                                static_cast<double>(rs.redelivered));
      metrics::AdvanceCounterTo(replay_metrics.dropped_stale,
                                static_cast<double>(rs.dropped_stale));
      metrics::AdvanceCounterTo(replay_metrics.dropped_full, static_cast<double>(rs.dropped_full));
    }
    if (report_file != nullptr) {
      std::fprintf(report_file, "%s\n", StepReportJson(r).c_str());
      std::fflush(report_file);
    }
    if (control != nullptr) {
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
      prl::v1::LearnerProgressRequest progress;
      progress.set_version(r.version);
      progress.set_groups_consumed(service.groups_consumed());
      prl::v1::LearnerProgressResponse ignored;
      control->ReportLearnerProgress(&ctx, progress, &ignored);  // best effort
    }
  });
}

absl::Status RunServe(ServeFlags f) {
  PRL_RETURN_IF_ERROR(ApplyConfig(f));
  if (f.model.empty()) {
    return absl::InvalidArgumentError(
        "learner serve: --model is required (or --config with model.path)");
  }
  absl::StatusOr<collective::RendezvousConfig> rendezvous = learner::RendezvousForThisRank();
  if (rendezvous.ok()) return ServeRank(f, *rendezvous);
  if (!absl::IsNotFound(rendezvous.status())) return rendezvous.status();
  PRL_RETURN_IF_ERROR(learner::ParseLossKind(f.loss).status());
  PRL_RETURN_IF_ERROR(learner::ParseOptimizerKind(f.optimizer).status());
  learner::LaunchOptions launch;
  launch.world_size = f.world_size;
  launch.grace_after_failure = absl::Seconds(f.timeout_s + 5);
  return learner::RunLocalRanks(f.argv, launch);
}

}  // namespace

void RegisterRoleCommands(CLI::App& app, CommandRegistry& registry, int argc, char** argv) {
  auto a = std::make_shared<ActorFlags>();
  CLI::App* actor = app.add_subcommand(
      "actor",
      "An actor server: leases prompts, generates groups, writes them to the replay "
      "buffer, swaps in new weights between engine steps");
  actor->add_option("--model", a->model,
                    "Starting weights (a model directory; or model.path of --config)");
  actor->add_option("--config", a->config_file,
                    "The run's config file (flags given here override it)");
  actor->add_option("--weights-address", a->weights_address,
                    "Receive weights over gRPC from this learner address (host:port)");
  actor->add_option("--metrics-address", a->metrics_address,
                    "Serve Prometheus /metrics here (host:port; port 0: any free port)");
  actor->add_option("--coordinator", a->coordinator, "Coordinator address")->capture_default_str();
  actor->add_option("--replay", a->replay, "Local replay segment (same node as the learner)");
  actor->add_option("--replay-address", a->replay_address, "Remote replay ingest (host:port)");
  actor->add_option("--weights", a->weights, "Weight segment the learner publishes to");
  actor->add_option("--name", a->options.name, "Actor name (logs, records)")->capture_default_str();
  actor->add_option("--run-id", a->options.run_id, "Run id written into records")
      ->capture_default_str();
  actor
      ->add_option("--max-prompts-in-flight", a->options.max_prompts_in_flight,
                   "Prompts generating at once")
      ->capture_default_str();
  actor->add_option("--max-num-seqs", a->options.engine.max_num_seqs, "Engine sequences in flight")
      ->capture_default_str();
  actor->add_option("--kv-cache-mb", a->kv_cache_mb, "KV cache pool")->capture_default_str();
  actor
      ->add_option("--replay-timeout-s", a->replay_timeout_s,
                   "How long a write waits while the replay buffer is full")
      ->capture_default_str();
  actor->add_flag("--char-tokenizer", a->char_tokenizer,
                  "Decode with the built-in task's character tokenizer (for text rewards)");
  a->command = actor;
  registry.Add(actor, [a] { return RunActor(*a); });

  CLI::App* learner = nullptr;
  for (CLI::App* sub : app.get_subcommands({})) {
    if (sub->get_name() == "learner") learner = sub;
  }
  auto s = std::make_shared<ServeFlags>();
  s->argv.assign(argv, argv + argc);
  CLI::App* serve = learner->add_subcommand(
      "serve",
      "The learner role: trains on groups from the replay buffer, publishes weights, "
      "checkpoints; resumes from its checkpoint");
  serve->add_option("--model", s->model,
                    "Starting weights (a model directory; or model.path of --config)");
  serve->add_option("--config", s->config_file,
                    "The run's config file (flags given here override it)");
  serve->add_option("--weights-listen", s->weights_listen,
                    "Publish weights over gRPC on this address instead of shared memory");
  serve->add_option("--metrics-address", s->metrics_address,
                    "Serve Prometheus /metrics here (host:port; port 0: any free port)");
  serve->add_option("--report-file", s->report_file, "Append one JSON line per step to this file");
  serve->add_option("--replay", s->replay, "Replay segment (created if missing)")
      ->capture_default_str();
  serve->add_option("--replay-mb", s->replay_mb, "Replay segment size")->capture_default_str();
  serve->add_option("--weights", s->weights, "Weight segment to publish to")->capture_default_str();
  serve->add_option("--coordinator", s->coordinator, "Coordinator to report progress to");
  serve->add_option("--world-size", s->world_size, "Local ranks")->capture_default_str();
  serve->add_option("--groups-per-step", s->options.groups_per_step, "Groups per step")
      ->capture_default_str();
  serve->add_option("--max-lag", s->options.max_lag, "Versions a token may lag")
      ->capture_default_str();
  serve->add_option("--max-steps", s->options.max_steps, "Stop after this many steps (0: never)")
      ->capture_default_str();
  serve->add_option("--checkpoint-dir", s->options.checkpoint_dir, "Sharded checkpoints");
  serve->add_option("--checkpoint-every", s->options.checkpoint_every, "Steps between them")
      ->capture_default_str();
  serve
      ->add_option("--loss", s->loss,
                   "reinforce_tis | ppo_clip | decoupled_ppo | icepop | "
                   "cispo | gspo | sft")
      ->capture_default_str();
  serve->add_option("--optimizer", s->optimizer, "adamw | sgd")->capture_default_str();
  serve->add_option("--lr", s->lr, "Learning rate")->capture_default_str();
  serve->add_option("--max-grad-norm", s->max_grad_norm, "Global-norm clipping (0: off)")
      ->capture_default_str();
  serve->add_option("--temperature", s->temperature, "The actors' sampling temperature")
      ->capture_default_str();
  serve->add_option("--advantage", s->advantage, "grpo | dr_grpo")->capture_default_str();
  serve
      ->add_option("--micro-batch-tokens", s->options.step.micro_batch_tokens,
                   "Input tokens per micro-batch")
      ->capture_default_str();
  serve->add_option("--timeout-s", s->timeout_s, "Per-collective time-out")->capture_default_str();
  s->command = serve;
  registry.Add(serve, [s] { return RunServe(*s); });
}

}  // namespace prl::cli
