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

class Run {
 public:
  explicit Run(const LocalRunOptions& o)
      : o_(o), c_(o.config), dir_(o.config.run_dir()), report_(c_, dir_ + "/learner_steps.jsonl") {}

  absl::StatusOr<std::string> Execute() {
    absl::StatusOr<std::string> result = ExecuteSteps();
    StopRoles();
    // Shared memory outlives processes: remove the run's segments on every exit path.
    ReplayBuffer::Remove(c_.replay_segment(), /*force=*/true).IgnoreError();
    roles::RemoveWeightTransportState(c_);
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
    if (c_.coordinator.adapters) {  // its task has no tenants' adapters to submit to yet
      return absl::UnimplementedError(
          "coordinator.adapters: prl run with tenants is not built yet; start the roles "
          "(prl coordinator, prl learner serve, prl actor) and submit each tenant's sets with "
          "prl submit --adapter (docs/tenants.md)");
    }
    PRL_RETURN_IF_ERROR(Prepare());
    PRL_ASSIGN_OR_RETURN(std::string start, PrepareStartModel(c_, o_.resume));
    PRL_ASSIGN_OR_RETURN(const ModelConfig model, ReadModelConfig(start));
    PRL_ASSIGN_OR_RETURN(task_, OpenTask(c_, start, model.vocab_size));
    PRL_RETURN_IF_ERROR(CheckEnvironmentText(c_, task_->text()));
    std::printf("task: %s, text: %s\n",
                std::string(EnumName(config::kTaskNames, c_.task.name)).c_str(),
                task_->text().Describe().c_str());
    if (c_.sft.steps > 0) {  // what the warm-start starts from
      PRL_ASSIGN_OR_RETURN(const EvalResult init, Evaluate(start, "eval_init"));
      outcome_.eval_init = init.accuracy;
    }
    PRL_ASSIGN_OR_RETURN(const WarmStartResult warm,
                         WarmStart(c_, *task_, start, o_.prl_path, o_.resume, o_.interrupted));
    outcome_.warm_start_seconds = warm.seconds;
    PRL_ASSIGN_OR_RETURN(const EvalResult before, Evaluate(warm.model, "eval_before"));
    outcome_.eval_before = before.accuracy;
    outcome_.multi_turn_before = before.multi_turn_rate;
    outcome_.turns_before = before.turns_mean;
    PRL_ASSIGN_OR_RETURN(roles_, PrepareRoles(c_, warm.model, o_.prl_path));
    outcome_.role_config = roles_.role_config_path;
    PRL_RETURN_IF_ERROR(StartRoles());
    PRL_RETURN_IF_ERROR(Supervise());
    StopRoles();
    PRL_RETURN_IF_ERROR(Export(warm.model));
    outcome_.model_final = dir_ + "/model-final";
    PRL_RETURN_IF_ERROR(CopyTokenizerFiles(start, outcome_.model_final));
    PRL_ASSIGN_OR_RETURN(const EvalResult after, Evaluate(outcome_.model_final, "eval_after"));
    outcome_.eval_after = after.accuracy;
    outcome_.multi_turn_after = after.multi_turn_rate;
    outcome_.turns_after = after.turns_mean;
    for (const Supervised& a : actors_) outcome_.actor_restarts += a.restarts;
    outcome_.learner_restarts = learner_.restarts;
    outcome_.coordinator_restarts = coordinator_.restarts;
    return report_.WriteSummary(outcome_);
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
                               "learner_steps.jsonl", "summary.json", "config.json"}) {
        left.push_back(fs::path(dir_) / name);
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
    }
    fs::create_directories(fs::path(dir_) / "logs", ec);
    if (ec) return absl::InternalError(absl::StrCat("creating ", dir_, ": ", ec.message()));
    return absl::OkStatus();
  }

  absl::StatusOr<EvalResult> Evaluate(const std::string& model_dir, const char* what) {
    PRL_ASSIGN_OR_RETURN(ParameterSet weights, LoadModel(model_dir, Device::Cpu()));
    const prl::v1::EnvironmentSpec environment = EnvironmentOf(c_);
    const prl::v1::AgentSpec agent = AgentOf(c_);
    PRL_ASSIGN_OR_RETURN(
        const EvalResult r,
        runner::Evaluate(std::make_shared<const ParameterSet>(std::move(weights)), *task_,
                         c_.task.eval_prompts, c_.task.max_tokens, environment, agent));
    std::printf("%s: %.3f greedy accuracy on %lld held-out prompts (%.1f s)", what, r.accuracy,
                static_cast<long long>(r.problems), r.seconds);
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
    feeder_.emplace(rc, *task_, channel);
    eval_.emplace(rc, *task_, channel);
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
    for (const std::string& line : roles_.lines) std::printf("%s\n", line.c_str());
    std::fflush(stdout);
    report_.Start();
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
        PRL_RETURN_IF_ERROR(feeder_->Feed());
        PRL_RETURN_IF_ERROR(eval_->Poll());
        next_feed = absl::Now() + absl::Milliseconds(100);
      }
      PRL_RETURN_IF_ERROR(report_.ReadSteps(feeder_->in_flight()));
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
    report_.Finish();
    PRL_RETURN_IF_ERROR(eval_->Poll());  // rounds that finished with the last steps
    outcome_.eval_curve = eval_->rounds();
    return report_.ReadSteps(feeder_->in_flight());
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
  // directory) and model-final/ is the RL start model with it merged in.
  absl::Status Export(const std::string& rl_start) {
    if (!c_.learner.lora()) {
      return RunTool("export", {o_.prl_path, "export", "--checkpoint-dir", c_.checkpoint_dir(),
                                "--out", dir_ + "/model-final"});
    }
    PRL_RETURN_IF_ERROR(RunTool("export", {o_.prl_path, "export", "--adapter", "--checkpoint-dir",
                                           c_.checkpoint_dir(), "--out", dir_ + "/adapter-final"}));
    return RunTool("merge", {o_.prl_path, "adapter", "merge", "--model", rl_start, "--adapter",
                             dir_ + "/adapter-final", "--out", dir_ + "/model-final"});
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
  std::unique_ptr<TaskSource> task_;
  RoleSpecs roles_;
  Supervised coordinator_, learner_;
  std::vector<Supervised> actors_;
  std::optional<PromptFeeder> feeder_;
  std::optional<TrainingEval> eval_;
  RunReport report_;
  RunReport::Outcome outcome_;
};

}  // namespace

absl::StatusOr<std::string> RunLocal(const LocalRunOptions& options) {
  Run run(options);
  return run.Execute();
}

}  // namespace prl::runner
