#include "cli/bench_flood.h"

#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "checkpoint/hf_model_dir.h"
#include "coordinator/list_client.h"
#include "core/status_macros.h"
#include "rpc/grpc_util.h"
#include "rpc/security.h"
#include "runner/prompt_feeder.h"
#include "runner/task_source.h"
#include "runner/warm_start.h"

namespace prl::cli {

namespace v1 = prl::v1;

TenantFlood::TenantFlood(const config::RunConfig& run, std::string tenant, int factor)
    : run_(run), tenant_(std::move(tenant)), factor_(factor) {}

absl::Status TenantFlood::Poll() {
  if (submitted()) return absl::OkStatus();
  if (prompts_ == nullptr) {
    // The coordinator's address as the run resolved it (prl run gives it a free port): the
    // effective config it writes to its run directory once its roles' settings are made.
    absl::StatusOr<config::RunConfig> effective =
        config::LoadRunConfig(run_.run_dir() + "/config.json", {});
    if (!effective.ok()) return absl::OkStatus();  // not written yet
    prompts_ = v1::PromptService::NewStub(
        rpc::NewChannel(effective->coordinator_address(), rpc::ChannelArgs(int64_t{64} << 20)));
  }
  absl::StatusOr<std::vector<v1::PromptSetStatus>> sets =
      coordinator::ListAllPromptSets(*prompts_, absl::Seconds(2));
  if (!sets.ok()) {
    // Not up yet (the run's warm-start), or restarting: a new channel next time, since one
    // refused for long waits out gRPC's growing reconnect backoff (up to two minutes).
    prompts_.reset();
    return absl::OkStatus();
  }
  for (const v1::PromptSetStatus& s : *sets) {
    if (!s.eval() && s.adapter() == tenant_) return SubmitAll();
  }
  return absl::OkStatus();
}

absl::Status TenantFlood::SubmitAll() {
  const config::TenantSection* section = nullptr;
  for (const config::TenantSection& t : run_.tenants) {
    if (t.name == tenant_) section = &t;
  }
  if (section == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("the run has no tenant '", tenant_, "'"));
  }
  const config::RunConfig c = run_.ForTenant(*section);
  // The model the run trains from (its tokenizer, for a prompts task): its warm-start's.
  const std::string model = runner::RlStartModel(run_);
  PRL_ASSIGN_OR_RETURN(const ModelConfig model_config, ReadModelConfig(model));
  PRL_ASSIGN_OR_RETURN(const std::unique_ptr<runner::TaskSource> task,
                       runner::OpenTask(c, model, model_config.vocab_size));
  v1::AdapterSpec adapter;  // the tenant's, as the run names it (its settings the defaults)
  adapter.set_name(tenant_);
  const int64_t per_set = c.learner.steps * c.learner.groups_per_step;
  for (; submitted_ < factor_ - 1; ++submitted_) {
    // Chunks far past the run feeder's: other prompts of the task than those it submits.
    PRL_ASSIGN_OR_RETURN(v1::SubmitPromptSetRequest request,
                         runner::TrainChunk(c, *task, adapter, 1'000'000 + submitted_, per_set));
    request.set_name(absl::StrCat(run_.run.name, " ", tenant_, " flood"));
    request.set_idempotency_key(
        absl::StrCat("prl-bench/", run_.run.name, "/", tenant_, "/flood/", submitted_));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    v1::SubmitPromptSetResponse response;
    const grpc::Status s = prompts_->SubmitPromptSet(&ctx, request, &response);
    if (!s.ok()) {
      if (s.error_code() == grpc::StatusCode::UNAVAILABLE) {  // tried again next time
        prompts_.reset();
        return absl::OkStatus();
      }
      return absl::FailedPreconditionError(absl::StrCat("the coordinator refused tenant ", tenant_,
                                                        "'s flood set: ", s.error_message()));
    }
    prompts_submitted_ += request.prompts_size();
  }
  return absl::OkStatus();
}

}  // namespace prl::cli
