#include "coordinator/coordinator.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "coordinator/capacity.h"
#include "coordinator/field_error.h"
#include "coordinator/ids.h"
#include "coordinator/prompt_format.h"
#include "core/group_id.h"
#include "core/status_macros.h"

namespace prl::coordinator {

absl::StatusOr<std::unique_ptr<Coordinator>> Coordinator::Open(const CoordinatorConfig& config) {
  if (config.log_path.empty()) {
    return absl::InvalidArgumentError("coordinator: log_path is required (the durable prompt log)");
  }
  if (config.max_attempts < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("coordinator: expected max_attempts >= 1, found ", config.max_attempts));
  }
  if (config.max_stale_reruns < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "coordinator: expected max_stale_reruns >= 1, found ", config.max_stale_reruns));
  }
  if (config.lease_ms <= 0 || config.heartbeat_ms <= 0 || config.heartbeat_ms >= config.lease_ms) {
    return absl::InvalidArgumentError(
        absl::StrCat("coordinator: expected 0 < heartbeat_ms < lease_ms, found heartbeat_ms = ",
                     config.heartbeat_ms, ", lease_ms = ", config.lease_ms));
  }
  std::unique_ptr<Coordinator> c(new Coordinator(config));
  PromptLogOptions log_options;
  log_options.group_commit = config.group_commit;
  log_options.before_sync = config.log_before_sync;
  PRL_ASSIGN_OR_RETURN(PromptLog::Opened opened, PromptLog::Open(config.log_path, log_options));
  c->log_ = std::move(opened.log);
  c->stats_.torn_log_bytes = opened.torn_bytes;
  std::lock_guard<std::mutex> lock(c->mu_);
  for (const prl::v1::LogRecord& record : opened.records) c->Apply(record);
  c->sets_.RecoverFinishTimes(opened.records);  // the retention clock of finished sets
  c->budget_.emplace(config.max_lag, config.groups_per_step, config.sync,
                     c->sets_.counts().groups_completed);  // the budget counts from here
  // Each adapter's budget counts from here too; its replies carry the coordinator's start.
  c->adapters_.Start({config.max_lag, config.groups_per_step, config.sync},
                     c->budget_->start_unix_ns());
  return c;
}

Coordinator::Coordinator(const CoordinatorConfig& config)
    : config_(config),
      sets_(config.max_text_bytes_per_set,
            [this](const PromptSets::Set& set) { return WaitNote(set); }),
      leases_(config.lease_ms),
      actors_(config.max_actors, config.lease_ms) {}

absl::StatusOr<prl::v1::SubmitPromptSetResponse> Coordinator::Submit(
    const prl::v1::SubmitPromptSetRequest& request, const Caller& caller) {
  prl::v1::SubmitPromptSetResponse response;
  const auto duplicate = [&]() -> const std::string* {  // mutex held
    // Keys are per caller: a tenant's key never answers with (or reveals) another's set.
    const std::string* id = request.idempotency_key().empty()
                                ? nullptr
                                : sets_.ByIdempotencyKey(caller.tenant, request.idempotency_key());
    return id;
  };
  // A duplicate is acknowledged once the first submission is durable: it may still be in its
  // fsync (applied, not yet answered). Everything written so far covers it.
  const auto answer_duplicate =
      [&](const std::string& id,
          std::unique_lock<std::mutex>& lock) -> absl::StatusOr<prl::v1::SubmitPromptSetResponse> {
    response.set_prompt_set_id(id);
    response.set_duplicate(true);
    const uint64_t written = log_->last_ticket();
    lock.unlock();
    PRL_RETURN_IF_ERROR(log_->WaitDurable(written));
    return response;
  };
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (const std::string* known = duplicate()) return answer_duplicate(*known, lock);
  }
  // Checks and tokenisation (a chat template per prompt) run without the mutex.
  prl::v1::LogRecord record;
  prl::v1::SubmittedPromptSet* submitted = record.mutable_submitted();
  PRL_RETURN_IF_ERROR(Validate(request, caller, submitted->mutable_request()));
  if (request.has_adapter() || config_.adapters) {
    PRL_RETURN_IF_ERROR(ValidateAdapter(request, submitted->mutable_request()->mutable_adapter()));
  }
  if (request.has_environment() || request.has_agent()) {  // episodes start from the prompts
    for (const prl::v1::Prompt& p : request.prompts()) {
      *submitted->add_episode_prompts() = EpisodePromptOf(p);
    }
  }
  std::unique_lock<std::mutex> lock(mu_);
  if (const std::string* known = duplicate()) {  // the same key, submitted meanwhile
    return answer_duplicate(*known, lock);
  }
  // The caller's quotas, and the set's adapter found or made (tenancy.cc).
  PRL_ASSIGN_OR_RETURN(const std::optional<prl::v1::LogRecord> created,
                       AdmitLocked(caller, request.adapter(), submitted));
  const int64_t busy = sets_.PendingOrInFlight();
  if (busy + request.prompts_size() > config_.max_pending_prompts) {
    return absl::ResourceExhaustedError(
        absl::StrCat(busy, " prompts are pending or in flight and this set adds ",
                     request.prompts_size(), "; the limit is ", config_.max_pending_prompts,
                     " (max_pending_prompts): retry when some have completed"));
  }
  std::string id;
  do {
    id = absl::StrCat("ps-", RandomHex().substr(0, 12));
  } while (sets_.Find(id) != nullptr);
  submitted->set_prompt_set_id(id);
  submitted->set_created_unix_ms(absl::ToUnixMillis(absl::Now()));
  // Log first, then apply; the fsync is waited for without the mutex. Until it returns the set
  // is acknowledged to nobody (its prompts may be leased: if the fsync fails, the log refuses
  // every later append, and the client, never answered, submits again). A new adapter is
  // logged before its first set, so that a replay never meets a set of an unknown adapter.
  if (created.has_value()) {
    PRL_RETURN_IF_ERROR(log_->Write(*created).status());
    Apply(*created);
  }
  PRL_ASSIGN_OR_RETURN(uint64_t ticket, log_->Write(record));
  Apply(record);
  if (sets_.Find(id)->eval()) {  // its first round runs at once (coordinator/eval_rounds.h)
    PRL_ASSIGN_OR_RETURN(ticket, OpenEvalRoundLocked(id));
  }
  CompactIfDueLocked();  // bounded log (coordinator_snapshot.cc)
  lock.unlock();
  PRL_RETURN_IF_ERROR(log_->WaitDurable(ticket));
  response.set_prompt_set_id(id);
  return response;
}

void Coordinator::Apply(const prl::v1::LogRecord& record) {
  if (record.has_submitted()) {
    sets_.ApplySubmitted(record.submitted());
    const PromptSets::Set& set = *sets_.Find(record.submitted().prompt_set_id());
    // Tenants share the actors equally, whatever their number of sets (lease_scheduler.h): a
    // set's party is its tenant, or its adapter when submitted without a tenant's token.
    const std::string party = !set.submitted.tenant().empty()
                                  ? absl::StrCat("tenant:", set.submitted.tenant())
                              : !set.submitted.adapter_id().empty()
                                  ? absl::StrCat("adapter:", set.submitted.adapter_id())
                                  : std::string();
    scheduler_.AddSet(set.id(), static_cast<int64_t>(set.prompts.size()), set.weight, party);
    adapters_.AddSet(set.submitted.adapter_id(), set.id());
  } else if (record.has_completed()) {
    const prl::v1::CompletedGroup& completed = record.completed();
    const int64_t before = sets_.counts().groups_completed;
    sets_.ApplyCompleted(completed.prompt_set_id(), completed.result());
    leases_.End({completed.prompt_set_id(), completed.result().prompt_index()});
    if (sets_.counts().groups_completed > before) {  // a training group (not a duplicate)
      const PromptSets::Set* set = sets_.Find(completed.prompt_set_id());
      adapters_.Completed(set->submitted.adapter_id());
      if (!set->submitted.adapter_id().empty()) {
        auto& [groups, samples] = tenant_completed_[TenantLabel(set->submitted.tenant())];
        ++groups;
        samples += completed.result().rewards_size();
      }
    }
  } else if (record.has_adapter_created()) {
    adapters_.ApplyCreated(record.adapter_created());
  } else if (!record.adapter_deleted().empty()) {
    adapters_.ApplyDeleted(record.adapter_deleted());
  } else if (record.cancelled().size() > 0) {
    sets_.ApplyCancelled(record.cancelled());
  } else if (record.has_eval_round()) {
    for (int64_t index : sets_.ApplyEvalRound(record.eval_round())) {
      scheduler_.AddRerun(record.eval_round().prompt_set_id(), index);
    }
  } else if (record.has_failed_attempt()) {
    const prl::v1::FailedAttempt& attempt = record.failed_attempt();
    // A leased (or reopened) prompt is pending again, or failed.
    if (sets_.ApplyFailedAttempt(attempt)) {
      scheduler_.AddRerun(attempt.prompt_set_id(), attempt.prompt_index());
    }
    const PromptSets::Prompt* p = sets_.FindPrompt(attempt.prompt_set_id(), attempt.prompt_index());
    if (p != nullptr && p->state != PromptState::kLeased) {
      leases_.End({attempt.prompt_set_id(), attempt.prompt_index()});
    }
  }
  changed_.notify_all();
}

absl::StatusOr<prl::v1::PromptSetStatus> Coordinator::Get(const std::string& id,
                                                          const Caller& caller) {
  std::lock_guard<std::mutex> lock(mu_);
  const PromptSets::Set* set = VisibleSetLocked(id, caller);
  if (set == nullptr) return absl::NotFoundError(absl::StrCat("no prompt set '", id, "'"));
  return sets_.StatusOf(*set);
}

std::vector<prl::v1::PromptSetStatus> Coordinator::List(const Caller& caller) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<prl::v1::PromptSetStatus> out;
  for (const std::string& id : sets_.order()) {
    if (const PromptSets::Set* set = VisibleSetLocked(id, caller)) {
      out.push_back(sets_.StatusOf(*set));
    }
  }
  return out;
}

absl::StatusOr<prl::v1::ListPromptSetsResponse> Coordinator::ListPage(
    const prl::v1::ListPromptSetsRequest& request, const Caller& caller) {
  constexpr int kDefaultPage = 100, kMaxPage = 1000;
  const int page = request.page_size() == 0 ? kDefaultPage : request.page_size();
  if (page < 1 || page > kMaxPage) {
    return Invalid("page_size", absl::StrCat("0 (", kDefaultPage, ") or 1 to ", kMaxPage),
                   absl::StrCat(request.page_size()));
  }
  size_t first = 0;
  if (!request.page_token().empty() && !absl::SimpleAtoi(request.page_token(), &first)) {
    return Invalid("page_token", "a next_page_token of an earlier page",
                   absl::StrCat("'", request.page_token().substr(0, 32), "'"));
  }
  std::lock_guard<std::mutex> lock(mu_);
  // Tokens count only the sets the caller sees (a tenant's own): a page, its token and its
  // errors reveal nothing of other tenants' sets.
  std::vector<const PromptSets::Set*> visible;
  for (const std::string& id : sets_.order()) {
    if (const PromptSets::Set* set = VisibleSetLocked(id, caller)) visible.push_back(set);
  }
  if (first > visible.size()) {
    return Invalid("page_token", absl::StrCat("at most ", visible.size()), absl::StrCat(first));
  }
  prl::v1::ListPromptSetsResponse response;
  const size_t end = std::min(visible.size(), first + static_cast<size_t>(page));
  for (size_t i = first; i < end; ++i) *response.add_prompt_sets() = sets_.StatusOf(*visible[i]);
  if (end < visible.size()) response.set_next_page_token(absl::StrCat(end));
  return response;
}

absl::Status Coordinator::CheckGroup(const prl::v1::CheckGroupRequest& request) {
  std::lock_guard<std::mutex> lock(mu_);
  const std::string* lease = leases_.IdOf({request.prompt_set_id(), request.prompt_index()});
  if (lease != nullptr && GroupIdOfLease(*lease) == request.group_id()) {
    // The group enters the replay of the adapter the push names: its set's, never another's.
    const PromptSets::Set* set = sets_.Find(request.prompt_set_id());
    const std::string& adapter = set == nullptr ? std::string() : set->submitted.adapter_id();
    if (request.adapter_id() == adapter) return absl::OkStatus();
    ++stats_.rejected_groups;
    return absl::PermissionDeniedError(absl::StrCat(
        "adapter_id: expected the adapter of prompt set '", request.prompt_set_id(), "' ('",
        adapter, "'), found '", request.adapter_id().substr(0, 64), "': the group is refused"));
  }
  ++stats_.rejected_groups;
  return absl::FailedPreconditionError(absl::StrCat(
      "prompt ", request.prompt_index(), " of prompt set '", request.prompt_set_id(),
      "' has no open lease with group id ", request.group_id(), ": the group is refused"));
}

absl::StatusOr<prl::v1::PromptSetStatus> Coordinator::Cancel(const std::string& id,
                                                             const Caller& caller) {
  std::unique_lock<std::mutex> lock(mu_);
  const PromptSets::Set* set = VisibleSetLocked(id, caller);
  if (set == nullptr) return absl::NotFoundError(absl::StrCat("no prompt set '", id, "'"));
  if (!set->running()) return sets_.StatusOf(*set);
  prl::v1::LogRecord record;
  record.set_cancelled(id);
  PRL_ASSIGN_OR_RETURN(const uint64_t ticket, log_->Write(record));
  Apply(record);
  const prl::v1::PromptSetStatus status = sets_.StatusOf(*set);
  lock.unlock();  // the fsync is waited for without the mutex
  PRL_RETURN_IF_ERROR(log_->WaitDurable(ticket));
  return status;
}

absl::StatusOr<std::vector<prl::v1::PromptSetEvent>> Coordinator::WatchEvents(
    const std::string& id, size_t* cursor, absl::Duration timeout, bool* finished,
    bool include_texts, const Caller& caller) {
  std::unique_lock<std::mutex> lock(mu_);
  const PromptSets::Set* set = VisibleSetLocked(id, caller);
  if (set == nullptr) return absl::NotFoundError(absl::StrCat("no prompt set '", id, "'"));
  std::vector<prl::v1::PromptSetEvent> out;
  if (*cursor == 0) {  // first call: the current status, then only what happens next
    *out.emplace_back().mutable_status() = sets_.StatusOf(*set);
    *cursor = set->events.size() + 1;
  } else {
    // The set may be retired (RetireFinishedLocked) while this waits: look it up again.
    changed_.wait_for(lock, absl::ToChronoMilliseconds(timeout), [&] {
      set = sets_.Find(id);
      return set == nullptr || set->events.size() + 1 > *cursor;
    });
    if (set == nullptr) return absl::NotFoundError(absl::StrCat("no prompt set '", id, "'"));
    for (size_t i = *cursor - 1; i < set->events.size(); ++i) {
      out.push_back(set->events[i]);
      if (!include_texts && out.back().has_group()) out.back().mutable_group()->clear_texts();
    }
    *cursor = set->events.size() + 1;
  }
  *finished = !set->running();
  return out;
}

absl::StatusOr<prl::v1::LearnerProgressResponse> Coordinator::LearnerProgress(
    int64_t version, int64_t groups_consumed, int64_t groups_waiting,
    const prl::v1::LearnerProgressResponse* seen) {
  prl::v1::LearnerProgressRequest request;
  request.set_version(version);
  request.set_groups_consumed(groups_consumed);
  request.set_groups_waiting(groups_waiting);
  if (seen != nullptr) *request.mutable_seen() = *seen;
  return LearnerProgress(request);
}

absl::StatusOr<prl::v1::LearnerProgressResponse> Coordinator::LearnerProgress(
    const prl::v1::LearnerProgressRequest& request) {
  std::lock_guard<std::mutex> lock(mu_);
  const prl::v1::LearnerProgressResponse* seen = request.has_seen() ? &request.seen() : nullptr;
  // The model's part is checked before the adapters' are taken: a refused report changes
  // nothing.
  absl::Status checked =
      budget_->Check(request.version(), request.groups_consumed(), request.groups_waiting());
  absl::StatusOr<prl::v1::LearnerProgressResponse> response = prl::v1::LearnerProgressResponse();
  if (checked.ok()) checked = AdapterProgressLocked(request, &*response);
  if (checked.ok()) {
    const prl::v1::LearnerProgressResponse adapters = *response;
    response = budget_->Report(request.version(), request.groups_consumed(),
                               request.groups_waiting(), seen, sets_.counts().groups_completed);
    if (response.ok()) response->MergeFrom(adapters);
  }
  if (!checked.ok() || !response.ok()) {
    ++stats_.rejected_progress;
    return checked.ok() ? response.status() : checked;
  }
  // The sets retired since the echoed reply (of this coordinator), else every one it still
  // remembers: a report is answered with what the learner has not heard yet.
  const int64_t retired = sets_.counts().sets_retired;
  const std::deque<std::string>& recently_retired = sets_.recently_retired();
  int64_t unseen = static_cast<int64_t>(recently_retired.size());
  if (seen != nullptr && seen->coordinator_start() == response->coordinator_start() &&
      seen->sets_retired() <= retired) {
    unseen = std::min(unseen, retired - seen->sets_retired());
  }
  for (auto it = recently_retired.end() - unseen; it != recently_retired.end(); ++it) {
    response->add_retired_prompt_sets(*it);
  }
  response->set_sets_retired(retired);
  OpenDueEvalRoundsLocked();  // the new version may be an evaluation's (eval_rounds.h)
  for (const auto& [name, series] : EvalSeriesLocked()) {  // for the learner's step reports
    prl::v1::EvalSetRound* round = response->add_eval_rounds();
    round->set_name(name);
    *round->mutable_round() = series.latest;
  }
  return response;
}

CoordinatorStats Coordinator::Stats() {
  std::lock_guard<std::mutex> lock(mu_);
  CoordinatorStats s = stats_;
  s.actors = actors_.size();
  s.learner_version = budget_->learner_version();
  s.groups_consumed = budget_->groups_consumed();
  const PromptSets::Counts& counts = sets_.counts();
  s.groups_unconsumed = budget_->Unconsumed(counts.groups_completed);
  s.prompt_sets = sets_.size();
  s.groups_completed = counts.groups_completed;
  s.prompts_failed = counts.prompts_failed;
  s.prompts_reopened = counts.prompts_reopened;
  s.sets_retired = counts.sets_retired;
  s.set_throughput = throughput_.by_name();
  s.eval_groups = counts.eval_groups;
  s.evals = EvalSeriesLocked();
  sets_.Totals(&s.prompts_pending, &s.prompts_in_flight, &s.prompts_done);
  for (const std::string& id : adapters_.order()) {
    const Adapters::Adapter& a = *adapters_.ById(id);
    CoordinatorStats::AdapterCounts& out = s.adapters[a.status.spec().name()];
    out.version = a.budget->learner_version();
    out.groups_consumed = a.budget->groups_consumed();
    out.groups_unconsumed = a.budget->Unconsumed(a.completions);
    out.prompts_in_flight = AdapterInFlightLocked(a);
    for (const std::string& set_id : a.sets) {
      const PromptSets::Set* set = sets_.Find(set_id);
      out.prompt_sets_running += set != nullptr && set->running() ? 1 : 0;
    }
    CoordinatorStats::TenantCounts& tenant = s.tenants[TenantLabel(a.status.tenant())];
    tenant.prompts_in_flight += out.prompts_in_flight;
    tenant.groups_trained += out.groups_consumed;
  }
  for (const auto& [tenant, completed] : tenant_completed_) {
    s.tenants[tenant].groups_completed = completed.first;
    s.tenants[tenant].samples_completed = completed.second;
  }
  return s;
}

}  // namespace prl::coordinator
