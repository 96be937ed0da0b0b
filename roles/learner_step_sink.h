// StepSink: where rank 0 of the learner role sends each step's report — the progress line on
// stdout, the Prometheus metrics (learner, weight sync, replay occupancy), one JSON line in
// learner.report_file (learner/step_report.h), and the learner's progress to the coordinator.
// The coordinator's lag budget counts the learner's backlog, so the progress also goes out once
// a second between steps: a learner waiting for a full step while the buffer drops stale groups
// would otherwise leave the coordinator counting groups it will never see trained.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "config/run_config.h"
#include "learner/learner_service.h"
#include "metrics/prl_metrics.h"
#include "prl/v1/prompt.grpc.pb.h"
#include "replay/quarantine.h"
#include "replay/replay_buffer.h"

namespace prl::roles {

// Hands prompts whose groups the learner will not train on back to the coordinator
// (ActorControl.ReopenPrompts). Thread-safe (a gRPC stub).
absl::Status ReopenPromptsAt(prl::v1::ActorControl::Stub& coordinator,
                             const std::vector<learner::StalePrompt>& prompts);

class StepSink {
 public:
  // `registry` and `replay` must outlive the sink.
  static absl::StatusOr<std::unique_ptr<StepSink>> Create(const config::RunConfig& config,
                                                          prometheus::Registry& registry,
                                                          ReplayBuffer* replay);
  ~StepSink();

  // The service resumed at `version` having consumed `groups_consumed` groups: progress is
  // reported from now on, before the first step (LearnerServiceOptions::on_started).
  void Started(int64_t version, int64_t groups_consumed);
  void Observe(const learner::LearnerStepReport& step, int64_t groups_consumed,
               const QuarantineCounts& dead_letters);
  // Hands prompts whose groups were too stale to train on back to the coordinator
  // (ActorControl.ReopenPrompts; thread-safe). Only with a coordinator address.
  bool has_coordinator() const { return coordinator_ != nullptr; }
  // Groups the replay buffer no longer holds that the learner has not trained yet (the step in
  // progress), added to every progress report's backlog; null: none. Thread-safe.
  void SetGroupsInStep(std::function<int64_t()> groups_in_step);
  absl::Status ReopenPrompts(const std::vector<learner::StalePrompt>& prompts);
  // The prompt sets the coordinator retired that this call has not returned before (the
  // progress replies' retired_prompt_sets, in retirement order), for the learner's ledger.
  // Thread-safe.
  std::vector<std::string> RetiredPromptSets();

 private:
  StepSink(const config::RunConfig& config, prometheus::Registry& registry, ReplayBuffer* replay);
  void UpdateMetrics(const learner::LearnerStepReport& step);
  // `with_step_groups`: count the step in progress (reports between steps; Observe's report
  // follows a finished step).
  void ReportProgress(int64_t version, int64_t groups_consumed, bool with_step_groups);

  metrics::ProcessMetrics process_;
  metrics::LearnerMetrics learner_;
  metrics::WeightSyncMetrics weights_;
  metrics::ReplayMetrics replay_metrics_;
  metrics::QuarantineMetrics dead_letters_;
  ReplayBuffer* replay_;
  std::FILE* report_file_ = nullptr;
  std::unique_ptr<prl::v1::ActorControl::Stub> coordinator_;
  // The last step's version (-1: no step yet) and groups consumed, re-reported once a second.
  std::atomic<int64_t> last_version_{-1}, last_consumed_{0};
  std::mutex report_mu_;                     // serialises progress reports (ReportProgress)
  std::function<int64_t()> groups_in_step_;  // guarded by report_mu_
  std::optional<prl::v1::LearnerProgressResponse> seen_;  // the last reply; guarded by report_mu_
  // Retired prompt sets the replies told and RetiredPromptSets has not returned yet (the most
  // recent kMaxRetired); guarded by report_mu_.
  static constexpr size_t kMaxRetired = 4096;
  std::deque<std::string> retired_;
  // Evaluation rounds the replies told (LearnerProgressResponse.eval_rounds) for the next step
  // report, and the newest version of each set already taken; guarded by report_mu_.
  std::vector<learner::EvalPoint> evals_pending_;
  std::map<std::string, int64_t> evals_taken_;
  std::mutex mu_;
  std::condition_variable stopping_;
  bool stop_ = false;
  std::thread reporter_;
};

}  // namespace prl::roles
