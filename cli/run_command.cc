// `prl run` (the whole pipeline on this machine, runner/local_run.h) and `prl bench e2e` (the
// same config in sync and pipeline mode, compared; with --tenants, cli/bench_tenants.h).
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/report.h"
#include "cli/bench_tenants.h"
#include "cli/command.h"
#include "cli/config_flags.h"
#include "config/run_config.h"
#include "core/child_process.h"
#include "core/status_macros.h"
#include "nlohmann/json.hpp"
#include "runner/local_run.h"

namespace prl::cli {

namespace {

std::atomic<bool> interrupted{false};

struct RunFlags {
  std::shared_ptr<ConfigFlags> config;
  bool resume = false;
};

absl::Status RunRun(const RunFlags& f, const config::RunConfig& config) {
  struct sigaction action {};
  action.sa_handler = [](int) { interrupted = true; };
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
  runner::LocalRunOptions options;
  options.config = config;
  options.prl_path = SelfPath();
  options.resume = f.resume;
  options.interrupted = &interrupted;
  absl::StatusOr<std::string> summary = runner::RunLocal(options);
  if (absl::IsCancelled(summary.status())) {
    std::printf(
        "interrupted: roles stopped, shared memory removed; the run directory %s is "
        "kept (continue with --resume)\n",
        config.run_dir().c_str());
    std::fflush(stdout);
    std::_Exit(130);
  }
  PRL_RETURN_IF_ERROR(summary.status());
  std::printf("summary: %s\n", summary->c_str());
  return absl::OkStatus();
}

// --- prl bench e2e --------------------------------------------------------------------------

struct E2eFlags {
  std::string config_file, run_dir = "runs/bench-e2e";
  std::vector<std::string> overrides;
  bool json = false;
  int tenants = 0;  // > 0: the tenants benchmark (cli/bench_tenants.h)
  std::string against = "separate";
  int flood = 0;  // >= 2 with --tenants: t0 floods
};

absl::StatusOr<nlohmann::json> RunMode(const E2eFlags& f, const std::string& mode,
                                       const std::vector<std::string>& extra) {
  std::vector<std::string> argv = {SelfPath(), "run",       "--mode",
                                   mode,       "--run-dir", f.run_dir + "/" + mode};
  if (!f.config_file.empty()) argv.insert(argv.end(), {"--config", f.config_file});
  for (const std::string& o : f.overrides) argv.insert(argv.end(), {"--set", o});
  for (const std::string& o : extra) argv.insert(argv.end(), {"--set", o});
  const std::string log = f.run_dir + "/" + mode + ".log";
  std::fprintf(stderr, "bench e2e: running %s mode (output in %s)\n", mode.c_str(), log.c_str());
  PRL_ASSIGN_OR_RETURN(ChildProcess child, ChildProcess::Start({mode, argv, log, {}}));
  while (child.running()) {
    if (interrupted) {
      child.Stop(absl::Seconds(60));
      return absl::CancelledError("interrupted");
    }
    absl::SleepFor(absl::Milliseconds(200));
  }
  const int status = *child.Poll();
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return absl::InternalError(
        absl::StrCat("prl run --mode ", mode, " ", DescribeWaitStatus(status), "; see ", log));
  }
  std::ifstream in(f.run_dir + "/" + mode + "/summary.json");
  nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
  if (j.is_discarded())
    return absl::InternalError("unreadable summary.json of the " + mode + " run");
  return j;
}

// Mean reward of the steps finished within `seconds` of the RL start (reward versus time).
double RewardBy(const nlohmann::json& summary, double from, double to) {
  double sum = 0;
  int n = 0;
  for (const auto& p : summary["reward_curve"]) {
    const double t = p["seconds"].get<double>();
    if (t > from && t <= to) {
      sum += p["reward"].get<double>();
      ++n;
    }
  }
  return n > 0 ? sum / n : 0.0;
}

absl::Status RunE2eBench(const E2eFlags& f) {
  std::error_code ec;
  std::filesystem::create_directories(f.run_dir, ec);
  struct sigaction action {};
  action.sa_handler = [](int) { interrupted = true; };
  sigaction(SIGINT, &action, nullptr);
  if (f.tenants > 0) {
    return RunTenantsBench(
        {f.config_file, f.run_dir, f.overrides, f.tenants, f.against, f.flood, f.json},
        interrupted);
  }
  // Sync first, with the warm-start; the pipeline run starts from the same warm model. Without
  // a warm-start (sft.steps=0) there is none: both create the same model from the config.
  PRL_ASSIGN_OR_RETURN(const nlohmann::json sync, RunMode(f, "sync", {}));
  const std::string warm = f.run_dir + "/sync/model-sft";
  std::vector<std::string> from_warm = {"sft.steps=0"};
  if (std::filesystem::exists(warm + "/config.json")) {
    from_warm.push_back(absl::StrCat("model.path=\"", warm, "\""));
  }
  PRL_ASSIGN_OR_RETURN(const nlohmann::json pipe, RunMode(f, "pipeline", from_warm));
  bench::Report report;
  report.bench = "e2e";
  report.machine = bench::MachineInfo();
  report.setup = {{"steps", absl::StrCat(pipe["steps"].get<int64_t>())},
                  {"config", f.config_file.empty() ? "built-in quickstart" : f.config_file}};
  auto add = [&](const std::string& name, const char* key, const std::string& unit) {
    report.results.push_back({"pipeline " + name, pipe[key].get<double>(), unit, "sync " + name,
                              sync[key].get<double>()});
  };
  add("samples/s", "samples_per_second", "samples/s");
  add("tokens/s", "tokens_per_second", "tokens/s");
  add("mean completion length", "completion_tokens_mean", "tokens");
  add("longest completion/step", "completion_tokens_step_max_mean", "tokens");
  add("mean lag", "mean_lag", "versions");
  add("max lag", "max_lag", "versions");
  add("RL wall time", "rl_seconds", "s");
  report.results.push_back({"pipeline eval_after - eval_before",
                            pipe["eval_after"].get<double>() - pipe["eval_before"].get<double>(),
                            "accuracy", "sync eval_after - eval_before",
                            sync["eval_after"].get<double>() - sync["eval_before"].get<double>()});
  if (pipe.contains("eval_multi_turn_after")) {  // agentic episodes (env.name)
    report.results.push_back({"pipeline held-out multi-turn share after",
                              pipe["eval_multi_turn_after"].get<double>(), "episodes",
                              "sync held-out multi-turn share after",
                              sync["eval_multi_turn_after"].get<double>()});
  }
  // Reward versus time: mean step reward in quarters of the shorter run.
  const double span = std::min(pipe["rl_seconds"].get<double>(), sync["rl_seconds"].get<double>());
  for (int q = 0; q < 4; ++q) {
    const double from = span * q / 4, to = span * (q + 1) / 4;
    report.results.push_back({absl::StrFormat("pipeline reward in %.0f-%.0f s", from, to),
                              RewardBy(pipe, from, to), "reward",
                              absl::StrFormat("sync reward in %.0f-%.0f s", from, to),
                              RewardBy(sync, from, to)});
  }
  std::printf("%s\n", f.json ? report.ToJson().c_str() : report.ToTable().c_str());
  return absl::OkStatus();
}

}  // namespace

void RegisterRunCommands(CLI::App& app, CommandRegistry& registry) {
  auto f = std::make_shared<RunFlags>();
  CLI::App* run = app.add_subcommand(
      "run",
      "Run the whole pipeline on this machine from one config file: coordinator, learner "
      "ranks and actors as supervised processes; warm-start, RL, held-out evaluation before "
      "and after, summary.json. Without --config: the built-in quickstart (arithmetic task, "
      "tiny model)");
  f->config = std::make_shared<ConfigFlags>(run);
  f->config->Shorthand("--mode", "run.mode").Shorthand("--run-dir", "run.dir");
  run->add_flag("--resume", f->resume,
                "Continue the run in the run directory (checkpoints, prompt log) instead of "
                "starting over");
  registry.Add(run, [f] {
    return f->config->Run([&](const config::RunConfig& c) { return RunRun(*f, c); });
  });

  CLI::App* bench = nullptr;
  for (CLI::App* sub : app.get_subcommands({})) {
    if (sub->get_name() == "bench") bench = sub;
  }
  auto e = std::make_shared<E2eFlags>();
  CLI::App* e2e = bench->add_subcommand(
      "e2e",
      "Run one config in sync mode (generate a batch with fixed weights, then train) and in "
      "pipeline mode; compare samples/s, tokens/s, lag and reward versus time");
  e2e->add_option("--config", e->config_file, "The run's config file (default: built-in)");
  e2e->add_option("--set", e->overrides, "Override one field: section.key=value (repeatable)");
  e2e->add_option("--run-dir", e->run_dir, "Where both runs go")->capture_default_str();
  e2e->add_flag("--json", e->json, "One JSON object instead of the table");
  e2e->add_option("--tenants", e->tenants,
                  "Instead: N tenants' adapters on one shared base in one run against N separate "
                  "LoRA runs at once on the same cores (samples/s, lag, held-out gains)");
  e2e->add_option("--against", e->against,
                  "With --tenants: separate (N separate LoRA runs at once) or one (one LoRA run "
                  "of one adapter alone: what multiplexing costs)")
      ->capture_default_str();
  e2e->add_option("--flood", e->flood,
                  "With --tenants: tenant t0 submits F times the prompts of each other (F - 1 "
                  "more sets from a client of the benchmark), against the same run without a "
                  "flood; each tenant's share of the fair share while all train");
  registry.Add(e2e, [e] { return RunE2eBench(*e); });
}

}  // namespace prl::cli
