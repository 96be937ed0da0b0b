// Completing a lease (declared in coordinator.h): the group's result is checked, logged under
// the mutex and applied, and acknowledged once the log's group commit made it durable,
// waiting (Complete) or from the log's flusher (CompleteAsync, the gRPC server's path).
#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "coordinator/coordinator.h"
#include "coordinator/field_error.h"
#include "coordinator/ids.h"
#include "core/status_macros.h"

namespace prl::coordinator {

absl::StatusOr<prl::v1::CompleteResponse> Coordinator::Complete(
    const prl::v1::CompleteRequest& request) {
  PRL_ASSIGN_OR_RETURN(LoggedCompletion logged, LogCompletion(request));
  if (logged.ticket != 0) PRL_RETURN_IF_ERROR(log_->WaitDurable(logged.ticket));
  return logged.response;
}

void Coordinator::CompleteAsync(const prl::v1::CompleteRequest& request, CompleteDone done) {
  absl::StatusOr<LoggedCompletion> logged = LogCompletion(request);
  if (!logged.ok()) return done(logged.status());
  if (logged->ticket == 0) return done(std::move(logged->response));
  log_->OnDurable(logged->ticket, [response = std::move(logged->response),
                                   done = std::move(done)](absl::Status durable) mutable {
    if (!durable.ok()) return done(durable);
    done(std::move(response));
  });
}

absl::StatusOr<Coordinator::LoggedCompletion> Coordinator::LogCompletion(
    const prl::v1::CompleteRequest& request) {
  std::lock_guard<std::mutex> lock(mu_);
  std::string set_id;
  int64_t index = 0;
  const PromptSets::Prompt* entry = nullptr;
  if (!ParseLeaseId(request.lease_id(), &set_id, &index) ||
      (entry = sets_.FindPrompt(set_id, index)) == nullptr) {
    return absl::NotFoundError(absl::StrCat("unknown lease '", request.lease_id(), "'"));
  }
  const PromptSets::Set& set = *sets_.Find(set_id);
  if (entry->state == PromptState::kDone || entry->state == PromptState::kFailed ||
      !set.running()) {
    ++stats_.duplicate_completions;
    LoggedCompletion duplicate;
    duplicate.response.set_accepted(false);
    return duplicate;
  }
  // Only the actor that holds the lease, with its nonce: a lease that expired (and may have gone
  // to another actor) or a foreign one changes nothing.
  const LeaseTable::Lease* lease = leases_.Find(request.lease_id());
  if (entry->state != PromptState::kLeased || lease == nullptr ||
      lease->actor_id != request.actor_id()) {
    ++stats_.rejected_completions;
    return absl::FailedPreconditionError(
        absl::StrCat("lease '", request.lease_id(), "' is not held by actor '", request.actor_id(),
                     "' (it expired or belongs to another actor): the group is not recorded"));
  }
  const prl::v1::GroupResult& r = request.result();
  const int32_t n = set.submitted.request().samples_per_prompt();
  if (r.prompt_index() != index) {
    return Invalid("result.prompt_index", absl::StrCat(index, " (the lease's prompt)"),
                   absl::StrCat(r.prompt_index()));
  }
  if (r.rewards_size() != n || r.completion_tokens_size() != n) {
    return Invalid("result.rewards", absl::StrCat(n, " rewards and lengths (one per sample)"),
                   absl::StrCat(r.rewards_size(), " and ", r.completion_tokens_size()));
  }
  for (int i = 0; i < n; ++i) {
    if (!std::isfinite(r.rewards(i))) {
      return Invalid(absl::StrCat("result.rewards[", i, "]"), "a finite number",
                     absl::StrCat(r.rewards(i)));
    }
  }
  if (r.texts_size() != 0 && r.texts_size() != n) {
    return Invalid("result.texts", absl::StrCat("none or ", n, " (one per sample)"),
                   absl::StrCat(r.texts_size()));
  }
  prl::v1::LogRecord record;
  record.mutable_completed()->set_prompt_set_id(set_id);
  *record.mutable_completed()->mutable_result() = r;
  record.mutable_completed()->mutable_result()->clear_texts();  // texts are for watchers only
  // ---- Group commit (coordinator/prompt_log.h): the record is ordered and applied under the
  // mutex; the fsync, shared with concurrent completions, is waited for outside it. Until it
  // returns, the completion is acknowledged to nobody but watchers; if it fails, the log
  // refuses all later appends and a restarted coordinator re-runs the prompt.
  LoggedCompletion logged;
  PRL_ASSIGN_OR_RETURN(logged.ticket, log_->Write(record));
  *record.mutable_completed()->mutable_result() = r;  // watchers get the texts (bounded)
  Apply(record);
  throughput_.Completed(set.submitted.request().name());
  CompactIfDueLocked();
  // ---- the caller waits for logged.ticket after the mutex is released ----
  logged.response.set_accepted(true);
  return logged;
}

}  // namespace prl::coordinator
