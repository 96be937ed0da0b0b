// TrainingEval: `prl run`'s evaluation during training (eval.*; docs/operations.md, "Evaluation
// during training"). It submits the task's held-out prompts once as an evaluation set
// (SubmitPromptSetRequest.eval, idempotent), which the coordinator runs on the actors at
// learner version 0 and every eval.every_versions versions after (never trained on, within
// coordinator.eval_max_actor_share of each actor's slots), and follows the set's finished
// rounds: one progress line each, and the curve for summary.json. A tenant's evaluation (prl run
// with tenants) is a set of its adapter, whose rounds follow the adapter's version.
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "config/run_config.h"
#include "prl/v1/prompt.grpc.pb.h"
#include "runner/task_source.h"

namespace prl::runner {

class TrainingEval {
 public:
  // `task` must outlive this.
  // `adapter`: the tenant's adapter, or nullopt for the run's one model.
  TrainingEval(const config::RunConfig& config, const TaskSource& task,
               std::shared_ptr<grpc::Channel> coordinator,
               std::optional<prl::v1::AdapterSpec> adapter = std::nullopt);

  bool enabled() const { return config_.eval.every_versions > 0; }
  // Submits the set (until the coordinator accepts it), then prints the rounds finished since
  // the last call. A coordinator that is down (restarting) is tried again next time; a refused
  // submission is an error.
  absl::Status Poll();
  // The finished rounds, oldest first.
  const std::vector<prl::v1::EvalRoundResult>& rounds() const { return rounds_; }

 private:
  absl::StatusOr<prl::v1::SubmitPromptSetRequest> Request() const;

  const config::RunConfig& config_;
  const TaskSource& task_;
  const std::optional<prl::v1::AdapterSpec> adapter_;
  std::unique_ptr<prl::v1::PromptService::Stub> prompts_;
  std::string set_id_;  // once accepted
  std::vector<prl::v1::EvalRoundResult> rounds_;
};

}  // namespace prl::runner
