#include "runner/prompt_feeder.h"

#include "absl/strings/str_cat.h"
#include "coordinator/list_client.h"
#include "core/status_macros.h"

namespace prl::runner {

namespace v1 = prl::v1;

PromptFeeder::PromptFeeder(const config::RunConfig& config, const TaskSource& task,
                           std::shared_ptr<grpc::Channel> coordinator,
                           std::optional<v1::AdapterSpec> adapter)
    : config_(config),
      task_(task),
      adapter_(std::move(adapter)),
      prompts_(v1::PromptService::NewStub(coordinator)) {}

absl::StatusOr<v1::SubmitPromptSetRequest> TrainChunk(
    const config::RunConfig& c, const TaskSource& task,
    const std::optional<v1::AdapterSpec>& adapter, int64_t chunk, int64_t count) {
  PRL_ASSIGN_OR_RETURN(const std::vector<v1::Prompt> prompts, task.TrainPrompts(chunk, count));
  v1::SubmitPromptSetRequest request;
  // One series in the per-set metrics (per tenant).
  const std::string tenant = adapter.has_value() ? adapter->name() : "";
  request.set_name(absl::StrCat(c.run.name, tenant.empty() ? "" : " ", tenant, " train"));
  request.set_idempotency_key(
      absl::StrCat("prl-run/", c.run.name, tenant.empty() ? "" : "/", tenant, "/chunk/", chunk));
  if (adapter.has_value()) *request.mutable_adapter() = *adapter;
  request.set_samples_per_prompt(c.task.samples_per_prompt);
  v1::RolloutSampling* sampling = request.mutable_sampling();
  sampling->set_temperature(static_cast<float>(c.task.temperature));
  sampling->set_top_p(static_cast<float>(c.task.top_p));
  sampling->set_max_tokens(c.task.max_tokens);
  sampling->set_seed(c.run.seed * 31 + chunk);
  for (int32_t id : task.text().stop_ids()) sampling->add_stop_token_ids(id);
  SetScoring(c, task.TrainReward(), &request);
  for (const v1::Prompt& p : prompts) *request.add_prompts() = p;
  return request;
}

absl::Status PromptFeeder::Feed() {
  absl::StatusOr<std::vector<v1::PromptSetStatus>> sets =
      coordinator::ListAllPromptSets(*prompts_, absl::Seconds(5));
  if (!sets.ok()) return absl::OkStatus();  // the coordinator is restarting: try again next time
  int64_t pending = 0;
  in_flight_ = 0;
  for (const v1::PromptSetStatus& s : *sets) {
    if (s.eval()) continue;  // evaluation rounds are not train prompts (runner/training_eval.h)
    if (s.adapter() != (adapter_.has_value() ? adapter_->name() : "")) continue;  // another's
    pending += s.prompts_pending();
    in_flight_ += s.prompts_in_flight();
  }
  // The coordinator leases at most (max_lag + 1) steps' worth at a time.
  if (pending >= (config_.learner.max_lag + 2) * config_.learner.groups_per_step) {
    return absl::OkStatus();
  }
  PRL_ASSIGN_OR_RETURN(
      const v1::SubmitPromptSetRequest request,
      TrainChunk(config_, task_, adapter_, chunks_, 8 * config_.learner.groups_per_step));
  grpc::ClientContext submit_ctx;
  submit_ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::SubmitPromptSetResponse response;
  const grpc::Status s = prompts_->SubmitPromptSet(&submit_ctx, request, &response);
  if (s.ok()) {
    ++chunks_;
  } else if (s.error_code() == grpc::StatusCode::INVALID_ARGUMENT) {
    return absl::InvalidArgumentError(
        absl::StrCat("the coordinator refused the train prompts: ", s.error_message()));
  }
  return absl::OkStatus();
}

}  // namespace prl::runner
