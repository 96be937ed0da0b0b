// The lease lifecycle (declared in coordinator.h): how a lease ends without its group, and when
// a prompt is given up on.
//
// A lease ends as a failed attempt of its prompt when its actor releases it (Release, with a
// reason), when it expires, or when the actor's heartbeat no longer lists it. Each is logged as
// a FailedAttempt record carrying the prompt's attempt count and the reason; the attempt that
// reaches max_attempts marks the prompt failed. A prompt the learner hands back (its group came
// in too stale: ReopenPrompts) is logged the same way but counted as a stale re-run, apart from
// its attempts (staleness is the pipeline's doing, not the prompt's); the re-run that reaches
// max_stale_reruns marks it failed. Replaying the records (or the snapshot's one per prompt)
// rebuilds the counts and the failed prompts; leases themselves are not durable, so a
// coordinator restart is not an attempt.
#include <algorithm>
#include <cstdio>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "coordinator/capacity.h"
#include "coordinator/coordinator.h"
#include "core/status_macros.h"

namespace prl::coordinator {

namespace {

constexpr size_t kMaxDetailBytes = 1024;  // of a release's detail, which is logged

std::string ReasonName(prl::v1::ReleaseReason reason) {
  switch (reason) {
    case prl::v1::RELEASE_REASON_ENGINE_REFUSED:
      return "its engine refused the group";
    case prl::v1::RELEASE_REASON_REWARD_FAILED:
      return "the group's reward failed";
    case prl::v1::RELEASE_REASON_ENVIRONMENT_FAILED:
      return "an episode's environment failed";
    case prl::v1::RELEASE_REASON_RECLAIMED:
      return "given back for other prompt sets (fair share)";
    default:
      return "released";
  }
}

}  // namespace

std::string Coordinator::ActorName(const std::string& actor_id) const {
  return actors_.Describe(actor_id);
}

absl::StatusOr<prl::v1::ReleaseResponse> Coordinator::Release(
    const prl::v1::ReleaseRequest& request) {
  std::unique_lock<std::mutex> lock(mu_);
  const LeaseTable::Lease* lease = leases_.Find(request.lease_id());
  if (lease == nullptr || lease->actor_id != request.actor_id()) {
    ++stats_.rejected_releases;
    return absl::FailedPreconditionError(absl::StrCat(
        "lease '", request.lease_id(), "' is not held by actor '", request.actor_id(),
        "' (it expired, was completed or belongs to another actor): nothing is released"));
  }
  const PromptRef prompt = lease->prompt;
  std::string reason = absl::StrCat("released by actor ", ActorName(request.actor_id()), ": ",
                                    ReasonName(request.reason()));
  if (!request.detail().empty()) {
    absl::StrAppend(&reason, ": ", request.detail().substr(0, kMaxDetailBytes));
    if (request.detail().size() > kMaxDetailBytes) {
      absl::StrAppend(&reason, " [detail cut at ", kMaxDetailBytes, " of ", request.detail().size(),
                      " bytes]");
    }
  }
  uint64_t ticket = 0;
  if (request.reason() == prl::v1::RELEASE_REASON_RECLAIMED && lease->reclaim_asked) {
    ++stats_.leases_reclaimed;
    PRL_ASSIGN_OR_RETURN(ticket, ReclaimLocked(prompt, reason));
  } else {  // (a "reclaimed" lease the coordinator did not ask for is a failed attempt)
    ++stats_.leases_released;
    PRL_ASSIGN_OR_RETURN(ticket, FailAttemptLocked(prompt, reason));
  }
  prl::v1::ReleaseResponse response;
  response.set_prompt_failed(sets_.FindPrompt(prompt.set_id, prompt.index)->state ==
                             PromptState::kFailed);
  lock.unlock();
  PRL_RETURN_IF_ERROR(log_->WaitDurable(ticket));
  return response;
}

absl::StatusOr<prl::v1::ReopenPromptsResponse> Coordinator::Reopen(
    const prl::v1::ReopenPromptsRequest& request) {
  std::unique_lock<std::mutex> lock(mu_);
  prl::v1::ReopenPromptsResponse response;
  absl::StatusOr<uint64_t> ticket = uint64_t{0};
  for (const prl::v1::ReopenPromptsRequest::Prompt& r : request.prompts()) {
    const PromptSets::Set* set = sets_.Find(r.prompt_set_id());
    const PromptSets::Prompt* p = sets_.FindPrompt(r.prompt_set_id(), r.prompt_index());
    if (p == nullptr) continue;
    const std::string reason =
        absl::StrCat("handed back by the learner: ", r.reason().substr(0, kMaxDetailBytes));
    // Pending prompts run anyway, failed ones stay failed. A leased one: its group reached the
    // learner before the completion reached us (or another attempt is running); the lease
    // ends as a failed attempt, so a late Complete is refused and the prompt runs again.
    if (set->state == prl::v1::PROMPT_SET_STATE_CANCELLED ||
        (p->state != PromptState::kLeased && p->state != PromptState::kDone)) {
      continue;
    }
    const bool completed = p->state == PromptState::kDone;
    ticket = HandBackLocked({r.prompt_set_id(), r.prompt_index()}, reason);
    PRL_RETURN_IF_ERROR(ticket.status());
    // A completed prompt's group is out of the learner's backlog now: the lag budget frees its
    // place at once (a restarted learner that hands back stale groups before its first report
    // is not stuck behind a full budget).
    if (completed) {
      if (BudgetAdapterLocked(*set) != nullptr) {
        adapters_.HandedBack(set->submitted.adapter_id());
      } else {
        budget_->ForgetCompletion(sets_.counts().groups_completed);
      }
    }
    response.set_reopened(response.reopened() + 1);
  }
  lock.unlock();
  if (response.reopened() > 0) PRL_RETURN_IF_ERROR(log_->WaitDurable(*ticket));
  return response;
}

namespace {

// A FailedAttempt record of the prompt, its counts as they are.
prl::v1::LogRecord AttemptRecord(const std::string& set_id, int64_t index, int32_t attempts,
                                 int32_t stale_reruns) {
  prl::v1::LogRecord record;
  prl::v1::FailedAttempt* attempt = record.mutable_failed_attempt();
  attempt->set_prompt_set_id(set_id);
  attempt->set_prompt_index(index);
  attempt->set_attempts(attempts);
  attempt->set_stale_reruns(stale_reruns);
  return record;
}

}  // namespace

absl::StatusOr<uint64_t> Coordinator::FailAttemptLocked(const PromptRef& prompt,
                                                        const std::string& reason) {
  const PromptSets::Prompt& p = *sets_.FindPrompt(prompt.set_id, prompt.index);
  prl::v1::LogRecord record =
      AttemptRecord(prompt.set_id, prompt.index, p.attempts + 1, p.stale_reruns);
  prl::v1::FailedAttempt* attempt = record.mutable_failed_attempt();
  attempt->set_reason(reason);
  attempt->set_failed(p.attempts + 1 >= config_.max_attempts);
  return LogAttemptLocked(record);
}

absl::StatusOr<uint64_t> Coordinator::ReclaimLocked(const PromptRef& prompt,
                                                    const std::string& reason) {
  const PromptSets::Prompt& p = *sets_.FindPrompt(prompt.set_id, prompt.index);
  prl::v1::LogRecord record =
      AttemptRecord(prompt.set_id, prompt.index, p.attempts, p.stale_reruns);
  record.mutable_failed_attempt()->set_reason(reason);
  return LogAttemptLocked(record);
}

absl::StatusOr<uint64_t> Coordinator::HandBackLocked(const PromptRef& prompt,
                                                     const std::string& reason) {
  const PromptSets::Prompt& p = *sets_.FindPrompt(prompt.set_id, prompt.index);
  prl::v1::LogRecord record =
      AttemptRecord(prompt.set_id, prompt.index, p.attempts, p.stale_reruns + 1);
  prl::v1::FailedAttempt* attempt = record.mutable_failed_attempt();
  attempt->set_failed(p.stale_reruns + 1 >= config_.max_stale_reruns);
  attempt->set_reason(
      attempt->failed()
          ? absl::StrCat(reason, " [handed back ", attempt->stale_reruns(),
                         " times (coordinator.max_stale_reruns ", config_.max_stale_reruns,
                         "): its rollouts outlast learner.max_lag steps; raise learner.max_lag "
                         "or lower sampling.max_tokens]")
          : reason);
  attempt->set_reopened(p.state == PromptState::kDone);
  return LogAttemptLocked(record);
}

absl::StatusOr<uint64_t> Coordinator::LogAttemptLocked(const prl::v1::LogRecord& record) {
  // Applied even if the log refuses it: the lease has ended either way (and a log that refuses
  // records refuses every later one: the coordinator must restart).
  absl::StatusOr<uint64_t> ticket = log_->Write(record);
  Apply(record);
  CompactIfDueLocked();
  return ticket;
}

absl::Status Coordinator::AwaitLogged(const absl::StatusOr<uint64_t>& ticket) {
  PRL_RETURN_IF_ERROR(ticket.status());
  const absl::Status durable = log_->WaitDurable(*ticket);
  if (!durable.ok()) {
    std::fprintf(stderr, "coordinator: a failed attempt is not durable: %s\n",
                 std::string(durable.message()).c_str());
  }
  return durable;
}

std::string Coordinator::WaitNote(const PromptSets::Set& set) const {
  // Live actors only: one that stopped heartbeating leases nothing. Called for every status a
  // completion adds: the capacities are pointed to, not copied.
  return NoActorFits(actors_.LiveCapacities(absl::Now()), GroupShape{set.samples, set.max_tokens});
}

}  // namespace prl::coordinator
