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
#include "collective/rendezvous.h"
#include "core/status_macros.h"
#include "learner/learner_service.h"
#include "learner/local_launcher.h"
#include "prl/v1/prompt.grpc.pb.h"
#include "rpc/grpc_util.h"
#include "task/char_tokenizer.h"
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
  actor::ActorOptions options;
  int64_t kv_cache_mb = 256;
  double replay_timeout_s = 60;
  bool char_tokenizer = false;
};

absl::Status RunActor(ActorFlags f) {
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
  std::unique_ptr<ShmWeightSubscriber> weights;
  if (!f.weights.empty()) {
    ShmSubscriberOptions options;
    options.open_timeout = absl::Seconds(60);  // the learner may start after us
    PRL_ASSIGN_OR_RETURN(weights, ShmWeightSubscriber::Open(f.weights, config, options));
  }
  PRL_ASSIGN_OR_RETURN(
      auto a, actor::Actor::Create(initial, 0, std::move(writer), weights.get(), f.options));
  std::printf("actor %s: generating for %s\n", f.options.name.c_str(), f.coordinator.c_str());
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
  int world_size = 1;
  int64_t replay_mb = 256;
  double timeout_s = 300;
  std::string loss = "reinforce_tis", optimizer = "adamw", advantage = "grpo";
  double lr = 1e-5, max_grad_norm = 1.0, temperature = 1.0;
  learner::LearnerServiceOptions options;
  std::vector<std::string> argv;
};

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
  std::unique_ptr<ShmWeightPublisher> publisher;
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
    PRL_ASSIGN_OR_RETURN(publisher, ShmWeightPublisher::Create(f.weights, full.config));
    PRL_ASSIGN_OR_RETURN(const ShmSegmentInfo info, InspectShmWeightSegment(f.weights));
    options.published_version = info.newest_version;
  }
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

absl::Status RunServe(const ServeFlags& f) {
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
  actor->add_option("--model", a->model, "Starting weights (a model directory)")->required();
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
  serve->add_option("--model", s->model, "Starting weights (a model directory)")->required();
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
  registry.Add(serve, [s] { return RunServe(*s); });
}

}  // namespace prl::cli
