#include "runner/local_run.h"

#include <grpcpp/grpcpp.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "checkpoint/hf_model_dir.h"
#include "core/child_process.h"
#include "core/status_macros.h"
#include "replay/replay_buffer.h"
#include "roles/adapter_segments.h"
#include "roles/device_settings.h"
#include "roles/role_security.h"
#include "roles/weight_transports.h"
#include "rpc/grpc_util.h"
#include "runner/evaluation.h"
#include "runner/gpu_plan.h"
#include "runner/prompt_feeder.h"
#include "runner/role_specs.h"
#include "runner/run_report.h"
#include "runner/training_eval.h"
#include "runner/warm_start.h"

namespace prl::runner {

namespace {

namespace fs = std::filesystem;

// A supervised role: its process and how often it was restarted.
struct Supervised {
  std::optional<ChildProcess> process;
  int restarts = 0;
};

// What the run trains: its one model, or one tenant's adapter (config.tenants), each with its
// task, the feeder and evaluation of its prompt sets, its steps' report and its outcome.
struct Track {
  std::string tenant;        // empty: the run's one model
  config::RunConfig config;  // the run's, or the tenant's (RunConfig::ForTenant)
  std::optional<prl::v1::AdapterSpec> adapter;
  std::unique_ptr<TaskSource> task;
  std::optional<PromptFeeder> feeder;
  std::optional<TrainingEval> eval;
  std::unique_ptr<RunReport> report;
  RunReport::Outcome outcome;
  std::string adapter_id, adapter_final;  // a tenant's, once trained
};

prl::v1::AdapterSpec AdapterSpecOf(const config::TenantSection& t) {
  prl::v1::AdapterSpec a;
  a.set_name(t.name);
  a.set_rank(t.adapter.rank);
  a.set_alpha(t.adapter.alpha);
  a.set_rslora(t.adapter.rslora);
  for (const std::string& m : t.adapter.target_modules) a.add_target_modules(m);
  a.set_learning_rate(t.adapter.learning_rate);
  return a;
}

class Run {
 public:
  explicit Run(const LocalRunOptions& o) : o_(o), c_(o.config), dir_(o.config.run_dir()) {
    const std::string steps = dir_ + "/learner_steps.jsonl";  // learner.report_file (role_specs)
    if (c_.tenants.empty()) {
      Track& t = *tracks_.emplace_back(std::make_unique<Track>());
      t.config = c_;
      t.report = std::make_unique<RunReport>(t.config, steps);
    }
    config::RunConfig reports = c_;
    reports.learner.report_file = steps;
    for (const config::TenantSection& tenant : c_.tenants) {
      Track& t = *tracks_.emplace_back(std::make_unique<Track>());
      t.tenant = tenant.name;
      t.config = c_.ForTenant(tenant);
      t.adapter = AdapterSpecOf(tenant);
      t.report = std::make_unique<RunReport>(
          t.config, roles::AdapterReportFile(reports, tenant.name), tenant.name);
    }
  }

  absl::StatusOr<std::string> Execute() {
    absl::StatusOr<std::string> result = ExecuteSteps();
    StopRoles();
    // Shared memory outlives processes: remove the run's segments on every exit path.
    ReplayBuffer::Remove(c_.replay_segment(), /*force=*/true).IgnoreError();
    roles::RemoveWeightTransportState(c_);
    roles::RemoveAdapterSegments(c_);
    return result;
  }

 private:
  absl::StatusOr<std::string> ExecuteSteps() {
    std::printf("prl run: %s (%s mode), run directory %s\n", c_.run.name.c_str(),
                std::string(EnumName(config::kRunModeNames, c_.run.mode)).c_str(), dir_.c_str());
    // Settings this machine cannot honour fail now, not after the warm-start.
    PRL_RETURN_IF_ERROR(roles::ConfigureRoleSecurity(c_, rpc::Role::kClient, {}));
    PRL_RETURN_IF_ERROR(roles::CheckRoleDevices(c_));
    PRL_RETURN_IF_ERROR(PlanGpus(c_, VisibleGpus()).status());
    if (c_.learner.steps < 1) {
      return absl::InvalidArgumentError("learner.steps: prl run needs >= 1, found 0");
    }
    if (c_.coordinator.adapters && c_.tenants.empty()) {
      return absl::InvalidArgumentError(
          "tenants: prl run with coordinator.adapters trains its tenants' adapters: list them "
          "(\"tenants\": [{\"name\", \"task\", \"adapter\"}], docs/tenants.md), or start the "
          "roles (prl coordinator, prl learner serve, prl actor) and submit each tenant's sets "
          "with prl submit --adapter");
    }
    if (const auto named = config::LearnerRankAddresses(c_); !named.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          named.front().first,
          ": expected no {rank}: prl run starts every role on this machine (learner ranks on "
          "nodes of their own are started by hand or on Kubernetes: docs/tenants.md), found '",
          named.front().second, "'"));
    }
    PRL_RETURN_IF_ERROR(Prepare());
    PRL_ASSIGN_OR_RETURN(const std::string start, PrepareStartModel(ModelTaskConfig(), o_.resume));
    PRL_ASSIGN_OR_RETURN(const ModelConfig model, ReadModelConfig(start));
    PRL_RETURN_IF_ERROR(OpenTasks(start, model.vocab_size));
    std::vector<SftTask> sft;
    for (const auto& t : tracks_) sft.push_back({&t->config, t->task.get()});
    if (c_.sft.steps > 0) {  // what the warm-start starts from
      for (const auto& t : tracks_) {
        PRL_ASSIGN_OR_RETURN(const EvalResult init, Evaluate(*t, start, "eval_init"));
        t->outcome.eval_init = init.accuracy;
      }
    }
    PRL_ASSIGN_OR_RETURN(const WarmStartResult warm,
                         WarmStart(c_, sft, start, o_.prl_path, o_.resume, o_.interrupted));
    outcome_.warm_start_seconds = warm.seconds;
    for (const auto& t : tracks_) {
      PRL_ASSIGN_OR_RETURN(const EvalResult before, Evaluate(*t, warm.model, "eval_before"));
      t->outcome.eval_before = before.accuracy;
      t->outcome.multi_turn_before = before.multi_turn_rate;
      t->outcome.turns_before = before.turns_mean;
    }
    PRL_ASSIGN_OR_RETURN(roles_, PrepareRoles(c_, warm.model, o_.prl_path));
    outcome_.role_config = roles_.role_config_path;
    PRL_RETURN_IF_ERROR(StartRoles());
    PRL_RETURN_IF_ERROR(Supervise());
    if (!c_.tenants.empty()) PRL_RETURN_IF_ERROR(FindAdapters());
    StopRoles();
    for (const auto& t : tracks_) {
      PRL_RETURN_IF_ERROR(Export(*t, warm.model));
      PRL_RETURN_IF_ERROR(CopyTokenizerFiles(start, t->outcome.model_final));
      PRL_ASSIGN_OR_RETURN(const EvalResult after,
                           Evaluate(*t, t->outcome.model_final, "eval_after"));
      t->outcome.eval_after = after.accuracy;
      t->outcome.multi_turn_after = after.multi_turn_rate;
      t->outcome.turns_after = after.turns_mean;
    }
    for (const Supervised& a : actors_) outcome_.actor_restarts += a.restarts;
    outcome_.learner_restarts = learner_.restarts;
    outcome_.coordinator_restarts = coordinator_.restarts;
    if (c_.tenants.empty()) {
      Track& t = *tracks_.front();
      RunReport::Outcome o = t.outcome;
      o.warm_start_seconds = outcome_.warm_start_seconds;
      o.actor_restarts = outcome_.actor_restarts;
      o.learner_restarts = outcome_.learner_restarts;
      o.coordinator_restarts = outcome_.coordinator_restarts;
      o.role_config = outcome_.role_config;
      return t.report->WriteSummary(o);
    }
    std::vector<TenantSummary> tenants;
    for (const auto& t : tracks_) {
      tenants.push_back({t->tenant, t->adapter_id, t->adapter_final, t->outcome.model_final,
                         t->report.get(), t->outcome});
    }
    return WriteTenantsSummary(c_, tenants, outcome_);
  }

  // The config the start model is made for: a tenant's of the prompts task (which needs
  // model.path), else the first track's.
  config::RunConfig ModelTaskConfig() const {
    for (const auto& t : tracks_) {
      if (t->config.task.name == config::TaskName::kPrompts) return t->config;
    }
    return tracks_.front()->config;
  }

  // Each track's task; tenants share the base model, so their tasks' text must be the same.
  absl::Status OpenTasks(const std::string& start, int64_t vocab_size) {
    for (size_t i = 0; i < tracks_.size(); ++i) {
      const auto& t = tracks_[i];
      absl::StatusOr<std::unique_ptr<TaskSource>> task = OpenTask(t->config, start, vocab_size);
      if (!task.ok()) return Named(*t, task.status());
      t->task = *std::move(task);
      const absl::Status text = CheckEnvironmentText(t->config, t->task->text());
      if (!text.ok()) return Named(*t, text);
      const TaskSource& first = *tracks_.front()->task;
      if (t->task->text().Describe() != first.text().Describe()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "tenants[", i, "] ('", t->tenant, "').task: its text is ", t->task->text().Describe(),
            " but tenants[0] ('", tracks_.front()->tenant, "')'s is ", first.text().Describe(),
            ": tenants train adapters of one base model, so their tasks share its tokenizer"));
      }
      std::printf("%s%stask: %s, text: %s\n", t->tenant.c_str(), t->tenant.empty() ? "" : ": ",
                  std::string(EnumName(config::kTaskNames, t->config.task.name)).c_str(),
                  t->task->text().Describe().c_str());
    }
    return absl::OkStatus();
  }

  // A tenant's error names the tenant.
  static absl::Status Named(const Track& t, const absl::Status& s) {
    if (t.tenant.empty()) return s;
    return absl::Status(s.code(), absl::StrCat("tenant ", t.tenant, ": ", s.message()));
  }

  // Each tenant's adapter id, from the coordinator (before it stops).
  absl::Status FindAdapters() {
    auto stub = prl::v1::PromptService::NewStub(rpc::NewChannel(
        roles_.role_config.coordinator_address(), rpc::ChannelArgs(int64_t{16} << 20)));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    prl::v1::ListAdaptersResponse reply;
    const grpc::Status s = stub->ListAdapters(&ctx, prl::v1::ListAdaptersRequest(), &reply);
    if (!s.ok()) {
      return absl::UnavailableError(
          absl::StrCat("listing the tenants' adapters: ", s.error_message()));
    }
    for (const auto& t : tracks_) {
      for (const prl::v1::AdapterStatus& a : reply.adapters()) {
        if (a.spec().name() == t->tenant) t->adapter_id = a.adapter_id();
      }
      if (t->adapter_id.empty()) {
        return absl::InternalError(
            absl::StrCat("tenant ", t->tenant, ": the coordinator knows no adapter of that name"));
      }
    }
    return absl::OkStatus();
  }

  bool Interrupted() const { return o_.interrupted != nullptr && o_.interrupted->load(); }

  // A fresh run (no --resume) removes what an earlier run of this directory left, and only
  // that: a checkpoint directory outside the run directory is the user's, so one that holds
  // files is refused rather than deleted.
  absl::Status Prepare() {
    std::error_code ec;
    if (!o_.resume) {
      const fs::path checkpoints = fs::weakly_canonical(c_.checkpoint_dir(), ec);
      const fs::path run_dir = fs::weakly_canonical(dir_, ec);
      const std::string inside = checkpoints.lexically_relative(run_dir).string();
      const bool ours = !inside.empty() && inside != "." && !inside.starts_with("..");
      if (!ours && fs::exists(checkpoints, ec) && !fs::is_empty(checkpoints, ec)) {
        return absl::FailedPreconditionError(absl::StrCat(
            "learner.checkpoint_dir '", c_.checkpoint_dir(), "' is outside the run directory '",
            dir_,
            "' and holds files: a fresh prl run deletes only what it created in its run "
            "directory; pass --resume to continue from these checkpoints, or empty the "
            "directory, or choose another"));
      }
      std::vector<fs::path> left = {checkpoints};
      for (const char* name : {"model-init", "model-sft", "model-final", "adapter-final",
                               "sft.jsonl", "sft-checkpoints", "checkpoints", "coordinator", "logs",
                               "learner_steps.jsonl", "summary.json", "config.json", "tenants"}) {
        left.push_back(fs::path(dir_) / name);
      }
      for (const auto& t : tracks_) {
        if (!t->tenant.empty()) left.push_back(t->report->steps_path());
      }
      for (const fs::path& path : left) {
        if (path == checkpoints && !ours) continue;
        fs::remove_all(path, ec);
        if (ec) {
          return absl::InternalError(absl::StrCat("cannot remove ", path.string(),
                                                  " (left by an earlier run): ", ec.message()));
        }
      }
      ReplayBuffer::Remove(c_.replay_segment(), true).IgnoreError();
      roles::RemoveWeightTransportState(c_);
      roles::RemoveAdapterSegments(c_);
    }
    fs::create_directories(fs::path(dir_) / "logs", ec);
    if (ec) return absl::InternalError(absl::StrCat("creating ", dir_, ": ", ec.message()));
    return absl::OkStatus();
  }

  absl::StatusOr<EvalResult> Evaluate(const Track& t, const std::string& model_dir,
                                      const char* what) {
    PRL_ASSIGN_OR_RETURN(ParameterSet weights, LoadModel(model_dir, Device::Cpu()));
    const prl::v1::EnvironmentSpec environment = EnvironmentOf(t.config);
    const prl::v1::AgentSpec agent = AgentOf(t.config);
    absl::StatusOr<EvalResult> evaluated =
        runner::Evaluate(std::make_shared<const ParameterSet>(std::move(weights)), *t.task,
                         t.config.task.eval_prompts, t.config.task.max_tokens, environment, agent);
    if (!evaluated.ok()) return Named(t, evaluated.status());
    const EvalResult& r = *evaluated;
    std::printf("%s%s%s: %.3f greedy accuracy on %lld held-out prompts (%.1f s)", t.tenant.c_str(),
                t.tenant.empty() ? "" : ": ", what, r.accuracy, static_cast<long long>(r.problems),
                r.seconds);
    if (!agent.address().empty()) {
      std::printf("; the agent at %s: %.3f of two or more calls, %.2f calls on average",
                  agent.address().c_str(), r.multi_turn_rate, r.turns_mean);
    } else if (!environment.name().empty()) {
      std::printf("; %s episodes: %.3f of two or more model turns, %.2f turns on average",
                  environment.name().c_str(), r.multi_turn_rate, r.turns_mean);
    }
    std::printf("\n");
    std::fflush(stdout);
    return r;
  }

  absl::Status StartRoles() {
    const config::RunConfig& rc = roles_.role_config;
    const std::string address = rc.coordinator_address();
    PRL_ASSIGN_OR_RETURN(ChildProcess started, ChildProcess::Start(roles_.coordinator));
    coordinator_.process.emplace(std::move(started));
    auto channel = rpc::NewChannel(address, rpc::ChannelArgs(int64_t{64} << 20));
    PRL_RETURN_IF_ERROR(WaitForServer(*channel, *coordinator_.process, "the coordinator", address));
    for (const auto& t : tracks_) {
      t->feeder.emplace(t->config, *t->task, channel, t->adapter);
      t->eval.emplace(t->config, *t->task, channel, t->adapter);
    }
    PRL_ASSIGN_OR_RETURN(started, ChildProcess::Start(roles_.learner));
    learner_.process.emplace(std::move(started));
    if (rc.broadcast.transport == config::WeightTransport::kGrpc ||
        rc.broadcast.transport == config::WeightTransport::kNccl) {
      // Actors that subscribe before the learner listens back off (up to seconds) and can miss
      // a short run's versions: start them once the weights endpoint is up.
      const std::string weights = rc.weights_address();
      PRL_RETURN_IF_ERROR(
          WaitForServer(*rpc::NewChannel(weights, rpc::ChannelArgs(int64_t{1} << 20)),
                        *learner_.process, "the learner's weights endpoint", weights));
    }
    for (const ChildSpec& spec : roles_.actors) {
      PRL_ASSIGN_OR_RETURN(started, ChildProcess::Start(spec));
      actors_.emplace_back().process.emplace(std::move(started));
    }
    std::printf("roles: coordinator on %s, %d learner rank(s), %d actor(s); logs in %s/logs\n",
                address.c_str(), rc.learner.world_size, rc.actors.count, dir_.c_str());
    if (!c_.tenants.empty()) {
      std::printf("tenants: %zu, each training its own adapter on the shared base\n",
                  c_.tenants.size());
    }
    for (const std::string& line : roles_.lines) std::printf("%s\n", line.c_str());
    std::fflush(stdout);
    for (const auto& t : tracks_) t->report->Start();
    return absl::OkStatus();
  }

  // Waits until `channel` connects to the server `child` runs (a minute at most).
  absl::Status WaitForServer(grpc::Channel& channel, ChildProcess& child, const std::string& what,
                             const std::string& address) {
    const absl::Time deadline = absl::Now() + absl::Seconds(60);
    while (!channel.WaitForConnected(std::chrono::system_clock::now() +
                                     std::chrono::milliseconds(200))) {
      if (!child.running() || absl::Now() > deadline || Interrupted()) {
        return absl::UnavailableError(absl::StrCat(what, " did not come up on ", address, "; ",
                                                   child.spec().log_path, ":\n",
                                                   TailOfFile(child.spec().log_path)));
      }
    }
    return absl::OkStatus();
  }

  // Restarts an exited role within its budget, or fails the run naming it.
  absl::Status Revive(ChildProcess& child, int* restarts, int budget) {
    const int status = *child.Poll();
    const ChildSpec spec = child.spec();
    if (*restarts >= budget) {
      return absl::AbortedError(absl::StrCat(spec.name, " ", DescribeWaitStatus(status),
                                             " and its restart budget (", budget, ") is spent; ",
                                             spec.log_path, ":\n", TailOfFile(spec.log_path)));
    }
    ++*restarts;
    std::printf("supervisor: %s %s; restarting it (%d/%d)\n", spec.name.c_str(),
                DescribeWaitStatus(status).c_str(), *restarts, budget);
    std::fflush(stdout);
    PRL_ASSIGN_OR_RETURN(child, ChildProcess::Start(spec));
    return absl::OkStatus();
  }

  // Until the learner has taken learner.steps steps: feed prompts, follow the steps, revive
  // crashed roles.
  absl::Status Supervise() {
    absl::Time next_feed = absl::InfinitePast();
    while (true) {
      if (Interrupted()) return absl::CancelledError("interrupted");
      if (absl::Now() >= next_feed) {
        for (const auto& t : tracks_) {
          // A tenant whose adapter took its steps gets no more prompts (the others train on).
          const std::vector<learner::StepReport>& steps = t->report->steps();
          if (steps.empty() || steps.back().step < c_.learner.steps) {
            PRL_RETURN_IF_ERROR(Named(*t, t->feeder->Feed()));
          }
          PRL_RETURN_IF_ERROR(Named(*t, t->eval->Poll()));
        }
        next_feed = absl::Now() + absl::Milliseconds(100);
      }
      PRL_RETURN_IF_ERROR(ReadSteps());
      if (!coordinator_.process->running()) {
        PRL_RETURN_IF_ERROR(
            Revive(*coordinator_.process, &coordinator_.restarts, c_.coordinator.max_restarts));
      }
      for (Supervised& a : actors_) {  // each actor has its own restart budget
        if (!a.process->running()) {
          PRL_RETURN_IF_ERROR(Revive(*a.process, &a.restarts, c_.actors.max_restarts));
        }
      }
      if (!learner_.process->running()) {
        const int status = *learner_.process->Poll();
        if (WIFEXITED(status) && WEXITSTATUS(status) == 0) break;  // took learner.steps steps
        PRL_RETURN_IF_ERROR(Revive(*learner_.process, &learner_.restarts, c_.learner.max_restarts));
      }
      absl::SleepFor(absl::Milliseconds(100));
    }
    for (const auto& t : tracks_) {
      t->report->Finish();
      PRL_RETURN_IF_ERROR(t->eval->Poll());  // rounds that finished with the last steps
      t->outcome.eval_curve = t->eval->rounds();
    }
    return ReadSteps();
  }

  absl::Status ReadSteps() {
    for (const auto& t : tracks_) {
      PRL_RETURN_IF_ERROR(t->report->ReadSteps(t->feeder->in_flight()));
    }
    return absl::OkStatus();
  }

  void StopRoles() {
    for (Supervised& a : actors_) {
      if (a.process.has_value()) a.process->Stop(absl::Seconds(10));
      a.process.reset();
    }
    if (learner_.process.has_value()) learner_.process->Stop(absl::Seconds(30));
    learner_.process.reset();
    if (coordinator_.process.has_value()) coordinator_.process->Stop(absl::Seconds(10));
    coordinator_.process.reset();
  }

  // model-final/ from the last checkpoint; a LoRA run's adapter goes to adapter-final/ (a PEFT
  // directory) and model-final/ is the RL start model with it merged in. A tenant's go to
  // tenants/<name>/, from its adapter's checkpoints.
  absl::Status Export(Track& t, const std::string& rl_start) {
    if (!c_.learner.lora()) {
      t.outcome.model_final = dir_ + "/model-final";
      return RunTool("export", {o_.prl_path, "export", "--checkpoint-dir", c_.checkpoint_dir(),
                                "--out", t.outcome.model_final});
    }
    const std::string out = t.tenant.empty() ? dir_ : absl::StrCat(dir_, "/tenants/", t.tenant);
    const std::string checkpoints =
        t.tenant.empty() ? c_.checkpoint_dir()
                         : absl::StrCat(c_.checkpoint_dir(), "/adapters/", t.adapter_id);
    const std::string log = t.tenant.empty() ? "" : "-" + t.tenant;
    t.adapter_final = out + "/adapter-final";
    t.outcome.model_final = out + "/model-final";
    PRL_RETURN_IF_ERROR(
        RunTool("export" + log, {o_.prl_path, "export", "--adapter", "--checkpoint-dir",
                                 checkpoints, "--out", t.adapter_final}));
    return RunTool("merge" + log, {o_.prl_path, "adapter", "merge", "--model", rl_start,
                                   "--adapter", t.adapter_final, "--out", t.outcome.model_final});
  }

  absl::Status RunTool(const std::string& name, std::vector<std::string> argv) {
    const std::string log = absl::StrCat(dir_, "/logs/", name, ".log");
    PRL_ASSIGN_OR_RETURN(ChildProcess tool, ChildProcess::Start({name, std::move(argv), log, {}}));
    const int status = tool.Wait();
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      return absl::InternalError(absl::StrCat("prl ", name, " ", DescribeWaitStatus(status), "; ",
                                              log, ":\n", TailOfFile(log)));
    }
    return absl::OkStatus();
  }

  const LocalRunOptions& o_;
  const config::RunConfig c_;
  const std::string dir_;
  std::vector<std::unique_ptr<Track>> tracks_;  // the one model, or each tenant
  RoleSpecs roles_;
  Supervised coordinator_, learner_;
  std::vector<Supervised> actors_;
  RunReport::Outcome outcome_;  // the run's: warm-start, restarts, role config
};

}  // namespace

absl::StatusOr<std::string> RunLocal(const LocalRunOptions& options) {
  Run run(options);
  return run.Execute();
}

}  // namespace prl::runner
