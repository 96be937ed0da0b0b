#include "runner/training_eval.h"

#include <algorithm>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"

namespace prl::runner {

namespace v1 = prl::v1;

TrainingEval::TrainingEval(const config::RunConfig& config, const TaskSource& task,
                           std::shared_ptr<grpc::Channel> coordinator,
                           std::optional<v1::AdapterSpec> adapter)
    : config_(config),
      task_(task),
      adapter_(std::move(adapter)),
      prompts_(v1::PromptService::NewStub(coordinator)) {}

absl::StatusOr<v1::SubmitPromptSetRequest> TrainingEval::Request() const {
  const config::RunConfig& c = config_;
  PRL_ASSIGN_OR_RETURN(const std::vector<v1::Prompt> prompts,
                       task_.EvalPrompts(std::min(c.eval.prompts, c.task.eval_prompts)));
  v1::SubmitPromptSetRequest request;
  const std::string tenant = adapter_.has_value() ? adapter_->name() : "";
  request.set_name(absl::StrCat(c.run.name, tenant.empty() ? "" : " ", tenant, " eval"));
  request.set_idempotency_key(
      absl::StrCat("prl-run/", c.run.name, tenant.empty() ? "" : "/", tenant, "/eval"));
  if (adapter_.has_value()) *request.mutable_adapter() = *adapter_;
  request.set_samples_per_prompt(c.eval.samples);
  request.mutable_eval()->set_every_versions(c.eval.every_versions);
  request.mutable_eval()->set_pass_reward(c.eval.pass_reward);
  v1::RolloutSampling* sampling = request.mutable_sampling();
  sampling->set_temperature(c.eval.greedy ? 0.0f : static_cast<float>(c.task.temperature));
  sampling->set_top_p(c.eval.greedy ? 1.0f : static_cast<float>(c.task.top_p));
  sampling->set_max_tokens(c.task.max_tokens);
  sampling->set_seed(c.run.seed * 31 + 7);
  for (int32_t id : task_.text().stop_ids()) sampling->add_stop_token_ids(id);
  SetScoring(c, task_.EvalReward(), &request);  // the held-out evaluation's reward
  for (const v1::Prompt& p : prompts) *request.add_prompts() = p;
  return request;
}

absl::Status TrainingEval::Poll() {
  if (!enabled()) return absl::OkStatus();
  if (set_id_.empty()) {
    PRL_ASSIGN_OR_RETURN(const v1::SubmitPromptSetRequest request, Request());
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::SubmitPromptSetResponse response;
    const grpc::Status s = prompts_->SubmitPromptSet(&ctx, request, &response);
    if (s.error_code() == grpc::StatusCode::INVALID_ARGUMENT) {
      return absl::InvalidArgumentError(
          absl::StrCat("the coordinator refused the evaluation set: ", s.error_message()));
    }
    if (!s.ok()) return absl::OkStatus();  // restarting: again next time
    set_id_ = response.prompt_set_id();
  }
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  v1::GetPromptSetRequest get;
  get.set_prompt_set_id(set_id_);
  v1::PromptSetStatus status;
  if (!prompts_->GetPromptSet(&ctx, get, &status).ok()) return absl::OkStatus();
  // Rounds open at increasing versions; new ones are those after the last printed.
  const int64_t last = rounds_.empty() ? -1 : rounds_.back().version();
  for (const v1::EvalRoundResult& r : status.eval_rounds()) {
    if (r.version() <= last) continue;
    rounds_.push_back(r);
    std::printf(
        "%s%seval at version %lld: mean reward %.4f, pass@%d %.4f (%lld prompts, weights "
        "%lld-%lld%s)\n",
        adapter_.has_value() ? adapter_->name().c_str() : "", adapter_.has_value() ? ": " : "",
        static_cast<long long>(r.version()), r.mean_reward(), r.k(), r.pass_at_k(),
        static_cast<long long>(r.prompts()), static_cast<long long>(r.min_weight_version()),
        static_cast<long long>(r.max_weight_version()),
        r.prompts_failed() > 0 ? absl::StrCat(", ", r.prompts_failed(), " failed").c_str() : "");
    std::fflush(stdout);
  }
  return absl::OkStatus();
}

}  // namespace prl::runner
