#include "cli/bench_tenants.h"

#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <cctype>
#include <functional>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <optional>

#include "absl/strings/str_cat.h"
#include "bench/report.h"
#include "cli/bench_flood.h"
#include "cli/command.h"
#include "config/run_config.h"
#include "core/child_process.h"
#include "absl/strings/str_format.h"
#include "checkpoint/hf_model_dir.h"
#include "core/status_macros.h"
#include "model/lora.h"
#include "roles/learner_rank.h"
#include "roles/role_security.h"
#include "runner/warm_start.h"
#include "nlohmann/json.hpp"

namespace prl::cli {

namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

// One `prl run` of the benchmark: its config file and run directory, and its output's log.
struct RunSpec {
  std::string name;
  config::RunConfig config;
  std::string config_path, log;
};

absl::Status WriteConfig(const RunSpec& spec) {
  std::ofstream f(spec.config_path);
  f << config::RunConfigToJson(spec.config) << "\n";
  if (!f) return absl::InternalError(absl::StrCat("writing ", spec.config_path));
  return absl::OkStatus();
}

// The proportional set size (PSS, bytes) of `root` and every process under it: what they map,
// each shared page (a shared-memory segment, a mapped base, the binary) split between the
// processes that map it, so that the sum over processes counts it once. 0 for a process gone.
int64_t TreePss(pid_t root) {
  std::map<pid_t, std::vector<pid_t>> children;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator("/proc", ec)) {
    const std::string name = entry.path().filename().string();
    if (name.empty() || !std::all_of(name.begin(), name.end(), ::isdigit)) continue;
    std::ifstream stat(entry.path() / "stat");
    std::string line;
    std::getline(stat, line);
    const size_t close = line.rfind(')');  // the command may hold spaces and parentheses
    if (close == std::string::npos) continue;
    char state = 0;
    int ppid = 0;
    if (std::sscanf(line.c_str() + close + 1, " %c %d", &state, &ppid) == 2) {
      children[ppid].push_back(std::stoi(name));
    }
  }
  int64_t bytes = 0;
  std::vector<pid_t> todo = {root};
  while (!todo.empty()) {
    const pid_t pid = todo.back();
    todo.pop_back();
    for (pid_t child : children[pid]) todo.push_back(child);
    bytes += bench::ProcessPssBytes(pid);
  }
  return bytes;
}

// The memory of a side's processes over time: (unix seconds, PSS bytes of them all).
using MemorySamples = std::vector<std::pair<double, int64_t>>;

// The largest sample within [from, to] (unix seconds).
int64_t PeakWithin(const MemorySamples& samples, double from, double to) {
  int64_t peak = 0;
  for (const auto& [t, bytes] : samples) {
    if (t >= from && t <= to) peak = std::max(peak, bytes);
  }
  return peak;
}

// Starts every run at once and waits for them all; each one's summary.json. Meanwhile the PSS
// of all their processes together goes to *memory every half second, and `tick` (if any) is
// called as often (its error stops the runs).
absl::StatusOr<std::vector<Json>> RunAll(const std::vector<RunSpec>& specs,
                                         const std::atomic<bool>& interrupted,
                                         MemorySamples* memory,
                                         const std::function<absl::Status()>& tick = nullptr) {
  std::vector<ChildProcess> children;
  for (const RunSpec& s : specs) {
    PRL_RETURN_IF_ERROR(WriteConfig(s));
    std::fprintf(stderr, "bench e2e --tenants: running %s (output in %s)\n", s.name.c_str(),
                 s.log.c_str());
    PRL_ASSIGN_OR_RETURN(
        ChildProcess child,
        ChildProcess::Start({s.name, {SelfPath(), "run", "--config", s.config_path}, s.log, {}}));
    children.push_back(std::move(child));
  }
  absl::Time next_sample = absl::InfinitePast();
  while (
      std::any_of(children.begin(), children.end(), [](ChildProcess& c) { return c.running(); })) {
    absl::Status ticked = absl::OkStatus();
    if (tick != nullptr && absl::Now() >= next_sample) ticked = tick();
    if (interrupted || !ticked.ok()) {  // every run is told at once, then waited for
      for (ChildProcess& c : children) ::kill(c.pid(), SIGTERM);
      for (ChildProcess& c : children) c.Stop(absl::Seconds(60));
      return ticked.ok() ? absl::CancelledError("interrupted") : ticked;
    }
    if (absl::Now() >= next_sample) {
      int64_t bytes = 0;
      for (ChildProcess& c : children) bytes += TreePss(c.pid());
      memory->push_back({absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch()), bytes});
      next_sample = absl::Now() + absl::Milliseconds(500);
    }
    absl::SleepFor(absl::Milliseconds(100));
  }
  std::vector<Json> summaries;
  for (size_t i = 0; i < specs.size(); ++i) {
    const int status = *children[i].Poll();
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      return absl::InternalError(absl::StrCat("prl run (", specs[i].name, ") ",
                                              DescribeWaitStatus(status), "; see ", specs[i].log));
    }
    std::ifstream in(specs[i].config.run_dir() + "/summary.json");
    Json j = Json::parse(in, nullptr, false);
    if (j.is_discarded()) {
      return absl::InternalError(absl::StrCat("unreadable summary.json of ", specs[i].name));
    }
    summaries.push_back(std::move(j));
  }
  return summaries;
}

// One side's figures over its RL phase: from the first RL start to the last RL end.
struct Side {
  double samples = 0, tokens = 0, seconds = 0, lag_sum = 0, gain_sum = 0;
  int runs = 0;
  void Add(const Json& one) {  // a run's or a tenant's summary
    const double start = one["rl_start_unix"].get<double>();
    const double end = start + one["rl_seconds"].get<double>();
    first = runs == 0 ? start : std::min(first, start);
    last = runs == 0 ? end : std::max(last, end);
    seconds = last - first;
    samples += one["samples"].get<double>();
    tokens += one["completion_tokens"].get<double>();
    lag_sum += one["mean_lag"].get<double>() * one["samples"].get<double>();
    gain_sum += one["eval_after"].get<double>() - one["eval_before"].get<double>();
    ++runs;
  }
  double per_second(double x) const { return seconds > 0 ? x / seconds : 0; }
  double lag() const { return samples > 0 ? lag_sum / samples : 0; }
  double gain() const { return runs > 0 ? gain_sum / runs : 0; }
  double first = 0, last = 0;
};

// Each tenant's samples per second while every tenant trains (from the last tenant's RL start
// to the first tenant's last step), from the steps its adapter's learner reported
// (learner_steps.<name>.jsonl in the run directory), in the summary's order.
absl::StatusOr<std::vector<double>> RatesWhileAllTrain(const RunSpec& run, const Json& summary) {
  double from = 0, to = std::numeric_limits<double>::infinity();
  std::vector<std::vector<std::pair<double, double>>> steps;  // (unix time, samples)
  for (const Json& one : summary["tenants"]) {
    from = std::max(from, one["rl_start_unix"].get<double>());
    const std::string path = absl::StrCat(run.config.run_dir(), "/learner_steps.",
                                          one["name"].get<std::string>(), ".jsonl");
    std::ifstream in(path);
    std::string line;
    auto& mine = steps.emplace_back();
    while (std::getline(in, line)) {
      const Json step = Json::parse(line, nullptr, false);
      if (step.is_discarded() || !step.contains("unix_time") || !step.contains("samples")) {
        return absl::InternalError(absl::StrCat(path, ": unreadable step line '", line, "'"));
      }
      mine.push_back({step["unix_time"].get<double>(), step["samples"].get<double>()});
    }
    if (mine.empty()) return absl::InternalError(absl::StrCat(path, ": no steps"));
    to = std::min(to, mine.back().first);
  }
  if (!(to > from)) {
    return absl::InternalError("the tenants never trained all at once (no common window)");
  }
  std::vector<double> rates;
  for (const auto& mine : steps) {
    double samples = 0;
    for (const auto& [t, n] : mine) samples += (t > from && t <= to) ? n : 0;
    rates.push_back(samples / (to - from));
  }
  return rates;
}

// `prl bench e2e --tenants N --flood F`: N tenants in one run, then the same run where a client
// floods tenant t0 with F times the prompts of the others (cli/bench_flood.h), from the first
// run's warm model. The figure: each tenant's samples/s while all train, as a share of the fair
// share (their sum / N).
absl::Status RunFloodBench(const TenantsBenchFlags& f, const RunSpec& shared,
                           const std::atomic<bool>& interrupted) {
  RunSpec calm = shared, flooded = shared;
  flooded.name = "tenants-flood";
  flooded.config_path = f.run_dir + "/tenants-flood.json";
  flooded.log = f.run_dir + "/tenants-flood.log";
  flooded.config.run.name = shared.config.run.name + "-flood";
  flooded.config.run.dir = f.run_dir + "/tenants-flood";
  MemorySamples calm_memory, flood_memory;
  PRL_ASSIGN_OR_RETURN(const std::vector<Json> calm_run, RunAll({calm}, interrupted, &calm_memory));
  flooded.config.model.path = runner::RlStartModel(calm.config);
  flooded.config.sft.steps = 0;
  PRL_RETURN_IF_ERROR(roles::ConfigureRoleSecurity(flooded.config, rpc::Role::kClient, {}));
  TenantFlood flood(flooded.config, "t0", f.flood);
  PRL_ASSIGN_OR_RETURN(const std::vector<Json> flood_run,
                       RunAll({flooded}, interrupted, &flood_memory, [&] { return flood.Poll(); }));
  if (!flood.submitted()) {
    return absl::InternalError("the flood was not submitted before the run ended");
  }
  PRL_ASSIGN_OR_RETURN(const std::vector<double> calm_rates,
                       RatesWhileAllTrain(calm, calm_run.front()));
  PRL_ASSIGN_OR_RETURN(const std::vector<double> flood_rates,
                       RatesWhileAllTrain(flooded, flood_run.front()));
  const auto shares = [](const std::vector<double>& rates) {
    double sum = 0;
    for (double r : rates) sum += r;
    std::vector<double> out;
    for (double r : rates) out.push_back(sum > 0 ? r * rates.size() / sum : 0);
    return out;
  };
  const std::vector<double> calm_shares = shares(calm_rates), flood_shares = shares(flood_rates);
  const auto min_of_others = [](const std::vector<double>& v) {
    return *std::min_element(v.begin() + 1, v.end());
  };
  bench::Report report;
  report.bench = "e2e --tenants --flood";
  report.machine = bench::MachineInfo();
  report.setup = {
      {"tenants", absl::StrCat(f.tenants)},
      {"flood", absl::StrCat("t0 submits ", f.flood, "x the prompts of each other tenant (",
                             flood.prompts_submitted(), " prompts in ", f.flood - 1,
                             " sets beside its run's)")},
      {"baseline", "the same tenants, none flooding, from the same warm model"},
      {"steps per adapter", absl::StrCat(shared.config.learner.steps)},
      {"config", f.config_file.empty() ? "built-in quickstart" : f.config_file}};
  report.results.push_back({"others' least share of the fair share, t0 flooding",
                            min_of_others(flood_shares), "x", "the same, no flood",
                            min_of_others(calm_shares)});
  report.results.push_back(
      {"t0's share of the fair share, flooding", flood_shares[0], "x", "no flood", calm_shares[0]});
  for (size_t i = 0; i < flood_rates.size(); ++i) {
    report.results.push_back({absl::StrCat("t", i, " samples/s while all train, t0 flooding"),
                              flood_rates[i], "samples/s", "no flood", calm_rates[i]});
  }
  double flood_sum = 0, calm_sum = 0;
  for (double r : flood_rates) flood_sum += r;
  for (double r : calm_rates) calm_sum += r;
  report.results.push_back(
      {"all tenants samples/s, t0 flooding", flood_sum, "samples/s", "no flood", calm_sum});
  std::printf("%s\n", f.json ? report.ToJson().c_str() : report.ToTable().c_str());
  return absl::OkStatus();
}

}  // namespace

absl::Status RunTenantsBench(const TenantsBenchFlags& f, const std::atomic<bool>& interrupted) {
  if (f.tenants < 1 || f.tenants > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tenants: expected 1 to 64 tenants, found ", f.tenants));
  }
  PRL_ASSIGN_OR_RETURN(config::RunConfig base, config::LoadRunConfig(f.config_file, f.overrides));
  if (f.against != "separate" && f.against != "one") {
    return absl::InvalidArgumentError(
        absl::StrCat("--against: expected separate or one, found '", f.against, "'"));
  }
  const bool against_one = f.against == "one";
  if (!base.tenants.empty()) {
    return absl::InvalidArgumentError(
        "tenants: bench e2e --tenants makes its own tenants from the config's task; give a "
        "config without tenants");
  }
  if (!base.learner.lora_init.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "learner.lora_init: expected empty (each tenant's adapter starts new), found '",
        base.learner.lora_init, "'"));
  }
  if (base.learner.lora_rank == 0) {  // tenants train adapters: both sides train LoRA
    base.learner.lora_rank = 8;
    base.learner.lora_targets = "all-linear";
  }
  std::error_code ec;
  fs::create_directories(f.run_dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("creating ", f.run_dir, ": ", ec.message()));

  // The tenants' run: one base, N adapters, each tenant the config's task.
  RunSpec shared{"tenants", base, f.run_dir + "/tenants.json", f.run_dir + "/tenants.log"};
  shared.config.run.name = base.run.name + "-tenants";
  shared.config.run.dir = f.run_dir + "/tenants";
  shared.config.coordinator.adapters = true;
  for (int i = 0; i < f.tenants; ++i) {
    config::TenantSection& t = shared.config.tenants.emplace_back();
    t.name = absl::StrCat("t", i);
    t.task = base.task;
    t.env = base.env;
    t.agent = base.agent;
  }
  PRL_RETURN_IF_ERROR(config::ValidateRunConfig(shared.config));
  if (f.flood != 0) {
    if (f.flood < 2 || f.flood > 100 || f.tenants < 2) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--flood: expected 2 to 100 (times the others' prompts) with --tenants 2 or more, found ",
          f.flood, " with --tenants ", f.tenants));
    }
    return RunFloodBench(f, shared, interrupted);
  }
  MemorySamples shared_memory, separate_memory;
  PRL_ASSIGN_OR_RETURN(const std::vector<Json> tenants_run,
                       RunAll({shared}, interrupted, &shared_memory));
  const Json& t = tenants_run.front();

  // N separate runs at once, each from the tenants run's start model (its warm-start's).
  const std::string start = runner::RlStartModel(shared.config);
  std::vector<RunSpec> separate;
  for (int i = 0; i < (against_one ? 1 : f.tenants); ++i) {
    RunSpec& s = separate.emplace_back(RunSpec{absl::StrCat("separate-", i), base,
                                               absl::StrCat(f.run_dir, "/separate-", i, ".json"),
                                               absl::StrCat(f.run_dir, "/separate-", i, ".log")});
    s.config.run.name = absl::StrCat(base.run.name, "-separate-", i);
    s.config.run.dir = absl::StrCat(f.run_dir, "/separate-", i);
    s.config.model.path = start;
    s.config.sft.steps = 0;
  }
  PRL_ASSIGN_OR_RETURN(const std::vector<Json> runs,
                       RunAll(separate, interrupted, &separate_memory));

  Side tenants, apart;
  for (const Json& one : t["tenants"]) tenants.Add(one);
  for (const Json& one : runs) apart.Add(one);
  bench::Report report;
  report.bench = "e2e --tenants";
  report.machine = bench::MachineInfo();
  report.setup = {
      {"tenants", absl::StrCat(f.tenants)},
      {"against", against_one ? "one LoRA run of one adapter alone, the same settings"
                              : absl::StrCat(f.tenants, " separate LoRA runs at once")},
      {"steps per adapter", absl::StrCat(base.learner.steps)},
      {"adapter", absl::StrCat("rank ", base.learner.lora_rank, ", ", base.learner.lora_targets)},
      {"actors per run", absl::StrCat(base.actors.count)},
      {"config", f.config_file.empty() ? "built-in quickstart" : f.config_file}};
  const std::string them =
      against_one ? std::string("one adapter alone") : absl::StrCat(f.tenants, " separate runs");
  report.results.push_back({"tenants samples/s", tenants.per_second(tenants.samples), "samples/s",
                            them + " samples/s", apart.per_second(apart.samples)});
  report.results.push_back({"tenants tokens/s", tenants.per_second(tenants.tokens), "tokens/s",
                            them + " tokens/s", apart.per_second(apart.tokens)});
  report.results.push_back(
      {"tenants RL wall time", tenants.seconds, "s", them + " RL wall time", apart.seconds});
  report.results.push_back(
      {"tenants samples", tenants.samples, "samples", them + " samples", apart.samples});
  // Memory during the RL phase (the warm-start's and evaluations' processes aside).
  constexpr double kMiB = 1 << 20;
  const double apart_peak =
      static_cast<double>(PeakWithin(separate_memory, apart.first, apart.last)) / kMiB;
  if (against_one) {  // its memory plus the other adapters' state: weights, gradient, moments
    PRL_ASSIGN_OR_RETURN(const ModelConfig model,
                         ReadModelConfig(start));
    PRL_ASSIGN_OR_RETURN(const std::optional<LoraConfig> lora,
                         roles::AdapterSettings(base.learner));
    PRL_ASSIGN_OR_RETURN(LoraSet one, LoraSet::Allocate(model, *lora, Device::Cpu(), false));
    const double state_mib = 16.0 * one.layout.num_elements() / kMiB;
    report.results.push_back(
        {"tenants peak memory (PSS, every process)",
         static_cast<double>(PeakWithin(shared_memory, tenants.first, tenants.last)) / kMiB,
         "MiB", absl::StrCat("one adapter alone + ", f.tenants - 1, " x adapter state (",
                             absl::StrFormat("%.2f", state_mib), " MiB)"),
         apart_peak + (f.tenants - 1) * state_mib});
    report.results.push_back({"one adapter alone peak memory", apart_peak, "MiB", "", 0});
  } else {
    report.results.push_back(
        {"tenants peak memory (PSS, every process)",
         static_cast<double>(PeakWithin(shared_memory, tenants.first, tenants.last)) / kMiB,
         "MiB", them + " peak memory (PSS, every process)", apart_peak});
  }
  report.results.push_back(
      {"tenants mean lag", tenants.lag(), "versions", them + " mean lag", apart.lag()});
  report.results.push_back({"tenants mean held-out gain", tenants.gain(), "accuracy",
                            them + " mean held-out gain", apart.gain()});
  if (shared_memory.empty() || shared_memory.front().second == 0) {
    std::fprintf(stderr, "bench e2e --tenants: no memory figure (/proc/PID/smaps_rollup, Linux "
                         "4.14 or later, could not be read)\n");
  }
  std::printf("%s\n", f.json ? report.ToJson().c_str() : report.ToTable().c_str());
  return absl::OkStatus();
}

}  // namespace prl::cli
