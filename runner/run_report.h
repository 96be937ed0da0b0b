// What `prl run` reports: it follows the learner's report file (one learner::StepReport JSON
// line per step, read strictly: a malformed line is an error naming it), prints one progress
// line per step, and writes summary.json at the end.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "config/run_config.h"
#include "learner/step_report.h"
#include "prl/v1/prompt.pb.h"

namespace prl::runner {

class RunReport {
 public:
  RunReport(const config::RunConfig& config, std::string steps_path)
      : config_(config), steps_path_(std::move(steps_path)) {}

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

  const std::vector<learner::StepReport>& steps() const { return steps_; }

 private:
  const config::RunConfig& config_;
  const std::string steps_path_;
  int64_t offset_ = 0;  // bytes of the report file read so far
  std::vector<learner::StepReport> steps_;
  int64_t completion_tokens_ = 0;
  absl::Time start_ = absl::Now();
  double rl_seconds_ = 0;
};

}  // namespace prl::runner
