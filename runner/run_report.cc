#include "runner/run_report.h"

#include <cstdio>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "nlohmann/json.hpp"

namespace prl::runner {

using Json = nlohmann::ordered_json;

absl::Status RunReport::ReadSteps(int64_t in_flight) {
  std::ifstream in(steps_path_);
  in.seekg(offset_);
  std::string line;
  while (std::getline(in, line)) {
    if (in.eof()) break;  // a partial last line: read it next time
    offset_ += static_cast<int64_t>(line.size() + 1);
    absl::StatusOr<learner::StepReport> step = learner::ParseStepReport(line);
    if (!step.ok()) {
      return absl::InternalError(
          absl::StrCat(steps_path_, " step ", steps_.size() + 1, ": ", step.status().message()));
    }
    steps_.push_back(*step);
    completion_tokens_ += step->completion_tokens;
    const double elapsed = absl::ToDoubleSeconds(absl::Now() - start_);
    std::printf(
        "%s%sstep %3lld/%lld | version %3lld | reward %.3f | lag mean %.2f max %.0f | %6.0f tok/s "
        "| "
        "%4lld samples in flight | %.0f s\n",
        label_.c_str(), label_.empty() ? "" : ": ", static_cast<long long>(step->step),
        static_cast<long long>(config_.learner.steps), static_cast<long long>(step->version),
        step->mean_reward, step->lag_mean, step->lag_max,
        elapsed > 0 ? static_cast<double>(completion_tokens_) / elapsed : 0.0,
        static_cast<long long>(in_flight * config_.task.samples_per_prompt), elapsed);
    std::fflush(stdout);
  }
  return absl::OkStatus();
}

Json RunReport::Summary(const Outcome& o) const {
  int64_t samples = 0, longest_sum = 0;
  double lag_sum = 0, lag_max = 0;
  Json curve = Json::array();
  const double start_unix = absl::ToDoubleSeconds(start_ - absl::UnixEpoch());
  for (const learner::StepReport& s : steps_) {
    samples += s.samples;
    lag_sum += s.lag_mean * static_cast<double>(s.samples);
    lag_max = std::max(lag_max, s.lag_max);
    longest_sum += s.completion_tokens_max;
    curve.push_back({{"step", s.step},
                     {"seconds", s.unix_time - start_unix},
                     {"reward", s.mean_reward},
                     {"lag_mean", s.lag_mean},
                     {"kl_behaviour_learner", s.kl_behaviour_learner}});
    if (!config_.env.name.empty() || !config_.agent.address.empty()) {
      curve.back()["multi_turn_fraction"] = s.multi_turn_fraction;
    }
  }
  const double seconds = rl_seconds_;
  Json j;
  j["run"] = config_.run.name;
  j["mode"] = std::string(EnumName(config::kRunModeNames, config_.run.mode));
  if (o.eval_init.has_value()) j["eval_init"] = *o.eval_init;
  j["eval_before"] = o.eval_before;
  j["eval_after"] = o.eval_after;
  j["eval_prompts"] = config_.task.eval_prompts;
  if (!config_.agent.address.empty()) j["agent"] = config_.agent.address;
  if (!config_.env.name.empty() || !config_.agent.address.empty()) {
    if (!config_.env.name.empty()) j["environment"] = config_.env.name;
    j["eval_multi_turn_before"] = o.multi_turn_before;
    j["eval_multi_turn_after"] = o.multi_turn_after;
    j["eval_turns_before"] = o.turns_before;
    j["eval_turns_after"] = o.turns_after;
  }
  j["steps"] = steps_.empty() ? 0 : steps_.back().step;
  j["samples"] = samples;
  j["completion_tokens"] = completion_tokens_;
  j["rl_seconds"] = seconds;
  j["tokens_per_second"] = seconds > 0 ? static_cast<double>(completion_tokens_) / seconds : 0;
  j["samples_per_second"] = seconds > 0 ? static_cast<double>(samples) / seconds : 0;
  // Completion lengths: the mean, and the mean over steps of each step's longest (what a sync
  // step waits for; their ratio is how long-tailed the lengths are).
  j["completion_tokens_mean"] =
      samples > 0 ? static_cast<double>(completion_tokens_) / static_cast<double>(samples) : 0;
  j["completion_tokens_step_max_mean"] =
      steps_.empty() ? 0 : static_cast<double>(longest_sum) / static_cast<double>(steps_.size());
  j["mean_lag"] = samples > 0 ? lag_sum / static_cast<double>(samples) : 0;
  j["max_lag"] = lag_max;
  j["rl_start_unix"] = start_unix;
  j["reward_curve"] = curve;
  if (config_.eval.every_versions > 0) {
    Json eval = Json::array();
    for (const prl::v1::EvalRoundResult& r : o.eval_curve) {
      eval.push_back({{"version", r.version()},
                      {"mean_reward", r.mean_reward()},
                      {absl::StrCat("pass_at_", r.k()), r.pass_at_k()},
                      {"prompts", r.prompts()},
                      {"weight_versions", {r.min_weight_version(), r.max_weight_version()}},
                      {"prompts_failed", r.prompts_failed()}});
    }
    j["eval_curve"] = eval;
  }
  return j;
}

namespace {

void AddRunWide(const RunReport::Outcome& o, Json& j) {
  j["warm_start_seconds"] = o.warm_start_seconds;
  j["restarts"] = {{"actor", o.actor_restarts},
                   {"learner", o.learner_restarts},
                   {"coordinator", o.coordinator_restarts}};
  j["config"] = o.role_config;
}

absl::Status WriteJson(const Json& j, const std::string& path) {
  std::ofstream f(path);
  f << j.dump(2) << "\n";
  if (!f) return absl::InternalError(absl::StrCat("writing ", path));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> RunReport::WriteSummary(const Outcome& o) const {
  Json j = Summary(o);
  AddRunWide(o, j);
  j["model_final"] = o.model_final;
  const std::string path = config_.run_dir() + "/summary.json";
  PRL_RETURN_IF_ERROR(WriteJson(j, path));
  const double seconds = rl_seconds_;
  const int64_t samples = j["samples"].get<int64_t>();
  std::printf(
      "done: %lld steps, %lld samples in %.0f s (%.0f tok/s), lag mean %.2f max %.0f; "
      "held-out accuracy %.3f -> %.3f\n",
      static_cast<long long>(j["steps"].get<int64_t>()), static_cast<long long>(samples), seconds,
      j["tokens_per_second"].get<double>(), j["mean_lag"].get<double>(), j["max_lag"].get<double>(),
      o.eval_before, o.eval_after);
  return path;
}

absl::StatusOr<std::string> WriteTenantsSummary(const config::RunConfig& run,
                                                const std::vector<TenantSummary>& tenants,
                                                const RunReport::Outcome& run_outcome) {
  Json j;
  j["run"] = run.run.name;
  j["mode"] = std::string(EnumName(config::kRunModeNames, run.run.mode));
  Json list = Json::array();
  int64_t samples = 0, tokens = 0;
  double start = 0, end = 0;  // the RL phase, unix seconds, over every tenant
  for (const TenantSummary& t : tenants) {
    Json one;
    one["name"] = t.name;
    one["adapter_id"] = t.adapter_id;
    one["adapter_final"] = t.adapter_final;
    one["model_final"] = t.model_final;
    one.update(t.report->Summary(t.outcome));
    one.erase("run");
    one.erase("mode");
    one["eval_gain"] = t.outcome.eval_after - t.outcome.eval_before;
    samples += one["samples"].get<int64_t>();
    tokens += one["completion_tokens"].get<int64_t>();
    const double s = one["rl_start_unix"].get<double>();
    const double e = s + one["rl_seconds"].get<double>();
    start = list.empty() ? s : std::min(start, s);
    end = list.empty() ? e : std::max(end, e);
    list.push_back(std::move(one));
  }
  const double seconds = end - start;
  j["tenants"] = list;
  j["samples"] = samples;
  j["completion_tokens"] = tokens;
  j["rl_start_unix"] = start;
  j["rl_seconds"] = seconds;
  j["samples_per_second"] = seconds > 0 ? static_cast<double>(samples) / seconds : 0;
  j["tokens_per_second"] = seconds > 0 ? static_cast<double>(tokens) / seconds : 0;
  AddRunWide(run_outcome, j);
  const std::string path = run.run_dir() + "/summary.json";
  PRL_RETURN_IF_ERROR(WriteJson(j, path));
  for (const Json& t : list) {
    std::printf(
        "done: tenant %s, %lld steps, %lld samples, lag mean %.2f; held-out accuracy "
        "%.3f -> %.3f\n",
        t["name"].get<std::string>().c_str(), static_cast<long long>(t["steps"].get<int64_t>()),
        static_cast<long long>(t["samples"].get<int64_t>()), t["mean_lag"].get<double>(),
        t["eval_before"].get<double>(), t["eval_after"].get<double>());
  }
  std::printf("done: %zu tenants, %lld samples in %.0f s (%.1f samples/s)\n", list.size(),
              static_cast<long long>(samples), seconds, j["samples_per_second"].get<double>());
  return path;
}

}  // namespace prl::runner
