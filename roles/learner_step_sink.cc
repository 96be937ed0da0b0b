#include "roles/learner_step_sink.h"

#include <grpcpp/grpcpp.h>

#include <chrono>

#include "absl/strings/str_cat.h"
#include "learner/step_report.h"
#include "roles/role_metrics.h"
#include "rpc/grpc_util.h"

namespace prl::roles {

StepSink::StepSink(const config::RunConfig& config, prometheus::Registry& registry,
                   ReplayBuffer* replay)
    : process_(registry, metrics::Role::kLearner),
      learner_(registry, learner::LossKindName(config.learner.loss)),
      weights_(registry),
      replay_metrics_(registry),
      dead_letters_(registry),
      replay_(replay) {
  learner_.max_lag_versions.Set(static_cast<double>(config.learner.max_lag));
}

StepSink::~StepSink() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  stopping_.notify_all();
  if (reporter_.joinable()) reporter_.join();
  if (report_file_ != nullptr) std::fclose(report_file_);
}

absl::StatusOr<std::unique_ptr<StepSink>> StepSink::Create(const config::RunConfig& config,
                                                           prometheus::Registry& registry,
                                                           ReplayBuffer* replay) {
  std::unique_ptr<StepSink> sink(new StepSink(config, registry, replay));
  const std::string& path = config.learner.report_file;
  if (!path.empty()) {
    sink->report_file_ = std::fopen(path.c_str(), "a");
    if (sink->report_file_ == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("learner.report_file: cannot append to '", path, "'"));
    }
  }
  const std::string coordinator = config.coordinator_address();
  if (!coordinator.empty()) {
    sink->coordinator_ = prl::v1::ActorControl::NewStub(
        rpc::NewChannel(coordinator, rpc::ChannelArgs(int64_t{1} << 20)));
    StepSink* raw = sink.get();
    raw->reporter_ = std::thread([raw] {
      for (;;) {
        {
          std::unique_lock<std::mutex> lock(raw->mu_);
          if (raw->stopping_.wait_for(lock, std::chrono::seconds(1),
                                      [raw] { return raw->stop_; })) {
            return;
          }
        }
        const int64_t version = raw->last_version_.load();
        if (version >= 0) raw->ReportProgress(version, raw->last_consumed_.load(), true);
      }
    });
  }
  return sink;
}

void StepSink::UpdateMetrics(const learner::LearnerStepReport& step) {
  const learner::StepReport& r = step.report;
  learner_.step_seconds.Observe(r.step_seconds);
  learner_.steps.Increment();
  learner_.tokens.Increment(static_cast<double>(r.trained_tokens));
  learner_.samples.Increment(static_cast<double>(r.samples));
  for (double lag : step.sample_max_lags) learner_.sample_max_lag_versions.Observe(lag);
  for (double lag : step.sample_mean_lags) learner_.sample_mean_lag_versions.Observe(lag);
  learner_.step_max_lag_versions.Set(r.lag_max);
  learner_.loss.Set(r.loss);
  learner_.importance_ratio_mean.Set(r.mean_ratio);
  learner_.importance_ratio_max.Set(r.max_ratio);
  learner_.clipped_tokens_ratio.Set(r.clipped_fraction);
  learner_.importance_weight_ess_ratio.Set(r.effective_sample_size);
  learner_.logprob_mismatch_kl.Set(r.kl_behaviour_learner);
  learner_.moe_route_mismatch_ratio.Set(r.route_mismatch_fraction);
  learner_.moe_lagged_route_mismatch_ratio.Set(r.lagged_route_mismatch_fraction);
  learner_.entropy.Set(r.entropy);
  learner_.policy_entropy.Set(r.policy_entropy);
  learner_.reference_kl.Set(r.reference_kl);
  learner_.peak_activation_bytes.Set(static_cast<double>(r.peak_activation_bytes));
  learner_.grad_norm.Set(r.grad_norm);
  learner_.learning_rate.Set(r.lr);
  weights_.publish_seconds.Observe(r.publish_seconds);
  process_.weight_version.Set(static_cast<double>(r.version));
  const ReplayStats rs = replay_->Stats();
  replay_metrics_.used_bytes.Set(static_cast<double>(rs.used_bytes));
  replay_metrics_.capacity_bytes.Set(static_cast<double>(rs.capacity_bytes));
  replay_metrics_.groups_ready.Set(static_cast<double>(rs.groups_ready));
  replay_metrics_.groups_leased.Set(static_cast<double>(rs.groups_leased));
  metrics::AdvanceCounterTo(replay_metrics_.groups_written, static_cast<double>(rs.groups_in));
  metrics::AdvanceCounterTo(replay_metrics_.bytes_written, static_cast<double>(rs.bytes_in));
  metrics::AdvanceCounterTo(replay_metrics_.groups_redelivered,
                            static_cast<double>(rs.redelivered));
  // Stale groups the buffer dropped and those the learner handed back to the coordinator.
  metrics::AdvanceCounterTo(replay_metrics_.dropped_stale,
                            static_cast<double>(r.dropped_stale_total));
  metrics::AdvanceCounterTo(replay_metrics_.dropped_full, static_cast<double>(rs.dropped_full));
  metrics::AdvanceCounterTo(replay_metrics_.dropped_uniform,
                            static_cast<double>(r.dropped_uniform_total));
  replay_metrics_.dropped_prompts_waiting.Set(static_cast<double>(rs.dropped_prompts_waiting));
  metrics::AdvanceCounterTo(replay_metrics_.dropped_prompts_overwritten,
                            static_cast<double>(rs.dropped_prompts_overwritten));
}

void StepSink::Started(int64_t version, int64_t groups_consumed) {
  if (last_version_.load() >= 0) return;  // a step was reported already
  last_consumed_ = groups_consumed;
  last_version_ = version;
}

void StepSink::ReportProgress(int64_t version, int64_t groups_consumed, bool with_step_groups) {
  if (coordinator_ == nullptr) return;
  // One report at a time, the backlog read just before it is sent: a report from the thread
  // between steps can never overtake a newer one with an older backlog (which let a sync-mode
  // coordinator lease a second batch for the same weights).
  std::lock_guard<std::mutex> lock(report_mu_);
  // Twice: the first reply tells the coordinator's completion count just before the backlog is
  // read for the second, which echoes it (prompt.proto, LearnerProgressRequest.seen), so that
  // the coordinator adds only the completions since then. The first report, echoing an older
  // reply, counts more (the groups trained since) and only holds leases back until the second.
  for (int pass = 0; pass < 2; ++pass) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    prl::v1::LearnerProgressRequest progress;
    progress.set_version(version);
    progress.set_groups_consumed(groups_consumed);
    if (seen_.has_value()) *progress.mutable_seen() = *seen_;
    const ReplayStats rs = replay_->Stats();  // the backlog: waiting, and taken for a step
    progress.set_groups_waiting(rs.groups_ready + rs.groups_leased +
                                (with_step_groups && groups_in_step_ ? groups_in_step_() : 0));
    prl::v1::LearnerProgressResponse reply;
    if (!coordinator_->ReportLearnerProgress(&ctx, progress, &reply).ok()) return;  // best effort
    for (const std::string& id : reply.retired_prompt_sets()) retired_.push_back(id);
    for (const prl::v1::EvalSetRound& e : reply.eval_rounds()) {  // new rounds, once each
      const auto taken = evals_taken_.find(e.name());
      if (taken != evals_taken_.end() && taken->second >= e.round().version()) continue;
      evals_taken_[e.name()] = e.round().version();
      std::erase_if(evals_pending_, [&](const learner::EvalPoint& p) { return p.set == e.name(); });
      evals_pending_.push_back({e.name(), e.round().version(), e.round().mean_reward(),
                                e.round().pass_at_k(), e.round().k(), e.round().prompts()});
    }
    while (retired_.size() > kMaxRetired) retired_.pop_front();
    seen_ = reply;
  }
}

void StepSink::SetGroupsInStep(std::function<int64_t()> groups_in_step) {
  std::lock_guard<std::mutex> lock(report_mu_);
  groups_in_step_ = std::move(groups_in_step);
}

std::vector<std::string> StepSink::RetiredPromptSets() {
  std::lock_guard<std::mutex> lock(report_mu_);
  std::vector<std::string> fresh(retired_.begin(), retired_.end());
  retired_.clear();
  return fresh;
}

absl::Status ReopenPromptsAt(prl::v1::ActorControl::Stub& coordinator,
                             const std::vector<learner::StalePrompt>& prompts) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  prl::v1::ReopenPromptsRequest request;
  for (const learner::StalePrompt& p : prompts) {
    prl::v1::ReopenPromptsRequest::Prompt* out = request.add_prompts();
    out->set_prompt_set_id(p.prompt_set_id);
    out->set_prompt_index(static_cast<int64_t>(p.prompt_index));
    out->set_reason(p.reason);
  }
  prl::v1::ReopenPromptsResponse response;
  return rpc::FromGrpcStatus(coordinator.ReopenPrompts(&ctx, request, &response));
}

absl::Status StepSink::ReopenPrompts(const std::vector<learner::StalePrompt>& prompts) {
  if (coordinator_ == nullptr) return absl::FailedPreconditionError("no coordinator address");
  return ReopenPromptsAt(*coordinator_, prompts);
}

void StepSink::Observe(const learner::LearnerStepReport& step, int64_t groups_consumed,
                       const QuarantineCounts& dead_letters) {
  ExportDeadLetters(dead_letters, dead_letters_);
  const learner::StepReport& r = step.report;
  std::printf(
      "step %lld: version %lld, %lld groups (%lld samples), reward %.4f, loss %.4g, ratio "
      "%.3f, lag mean %.2f max %.0f, %.0f tok/s, dropped stale %lld\n",
      static_cast<long long>(r.step), static_cast<long long>(r.version),
      static_cast<long long>(r.groups), static_cast<long long>(r.samples), r.mean_reward, r.loss,
      r.mean_ratio, r.lag_mean, r.lag_max,
      r.step_seconds > 0 ? r.input_tokens / r.step_seconds : 0.0,
      static_cast<long long>(r.dropped_stale));
  std::fflush(stdout);
  UpdateMetrics(step);
  if (report_file_ != nullptr) {
    learner::StepReport with_evals = r;
    {
      std::lock_guard<std::mutex> lock(report_mu_);
      with_evals.evals.swap(evals_pending_);
    }
    std::fprintf(report_file_, "%s\n", learner::StepReportToJson(with_evals).c_str());
    std::fflush(report_file_);
  }
  last_consumed_ = groups_consumed;
  last_version_ = r.version;
  ReportProgress(r.version, groups_consumed, false);
}

}  // namespace prl::roles
