// What `prl run` reports: it follows the learner's report file (one learner::StepReport JSON
// line per step, read strictly: a malformed line is an error naming it), prints one progress
// line per step, and writes summary.json at the end. With tenants (prl run's config.tenants)
// there is one report per tenant (its adapter's report file), and summary.json holds each
// tenant's summary and the run's totals (WriteTenantsSummary).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "config/run_config.h"
#include "learner/step_report.h"
#include "nlohmann/json.hpp"
#include "prl/v1/prompt.pb.h"

namespace prl::runner {

class RunReport {
 public:
  // `label`: the tenant whose steps these are (printed before each line); empty: none.
  RunReport(const config::RunConfig& config, std::string steps_path, std::string label = "")
      : config_(config), steps_path_(std::move(steps_path)), label_(std::move(label)) {}

  void Start() { start_ = absl::Now(); }
  // Reads the complete lines added since the last call and prints a progress line for each;
  // `in_flight` is the prompts leased to actors now.
  absl::Status ReadSteps(int64_t in_flight);
  void Finish() { rl_seconds_ = absl::ToDoubleSeconds(absl::Now() - start_); }

  struct Outcome {
    // Held-out accuracy of the start model (before the warm-start; when there is one), after
    // the warm-start (before RL) and after RL.
    std::optional<double> eval_init;
    double eval_before = 0, eval_after = 0, warm_start_seconds = 0;
    // With an environment: the held-out episodes' share of two or more model turns (the
    // calculator's tool-use rate) and their mean model turns, before and after RL.
    double multi_turn_before = 0, multi_turn_after = 0, turns_before = 0, turns_after = 0;
    // Evaluation during training (eval.*): the rounds, oldest first (runner/training_eval.h).
    std::vector<prl::v1::EvalRoundResult> eval_curve;
    int actor_restarts = 0, learner_restarts = 0, coordinator_restarts = 0;
    std::string model_final, role_config;
  };
  // Writes <run dir>/summary.json, prints the last line, returns the path.
  absl::StatusOr<std::string> WriteSummary(const Outcome& outcome) const;
  // The summary's fields of this run or tenant: held-out accuracies, steps, samples, rates,
  // lags, the reward and evaluation curves.
  nlohmann::ordered_json Summary(const Outcome& outcome) const;

  const std::vector<learner::StepReport>& steps() const { return steps_; }
  const std::string& steps_path() const { return steps_path_; }

 private:
  const config::RunConfig& config_;
  const std::string steps_path_, label_;
  int64_t offset_ = 0;  // bytes of the report file read so far
  std::vector<learner::StepReport> steps_;
  int64_t completion_tokens_ = 0;
  absl::Time start_ = absl::Now();
  double rl_seconds_ = 0;
};

// One tenant of prl run: its report and outcome, and where its adapter went.
struct TenantSummary {
  std::string name, adapter_id, adapter_final, model_final;
  const RunReport* report = nullptr;
  RunReport::Outcome outcome;
};
// Writes <run dir>/summary.json of a run with tenants: each tenant's summary (RunReport::Summary
// and its adapter) under "tenants", and the run's totals (samples, samples per second over the
// run's RL time); prints a line per tenant; returns the path.
absl::StatusOr<std::string> WriteTenantsSummary(const config::RunConfig& run,
                                                const std::vector<TenantSummary>& tenants,
                                                const RunReport::Outcome& run_outcome);

}  // namespace prl::runner
