#include "coordinator/coordinator.h"

#include <algorithm>
#include <limits>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "coordinator/capacity.h"
#include "coordinator/field_error.h"
#include "coordinator/ids.h"
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
  c->RecoverFinishTimesLocked(opened.records);  // retention (coordinator_snapshot.cc)
  c->budget_.emplace(config.max_lag, config.groups_per_step, config.sync,
                     c->stats_.groups_completed);  // the budget counts from here
  return c;
}

int64_t Coordinator::PendingOrInFlightLocked() const {
  int64_t n = 0;
  for (const auto& [id, set] : sets_) {
    if (set.state == prl::v1::PROMPT_SET_STATE_RUNNING) n += set.pending + set.in_flight;
  }
  return n;
}

absl::StatusOr<prl::v1::SubmitPromptSetResponse> Coordinator::Submit(
    const prl::v1::SubmitPromptSetRequest& request) {
  std::lock_guard<std::mutex> lock(mu_);
  prl::v1::SubmitPromptSetResponse response;
  if (!request.idempotency_key().empty()) {
    auto it = idempotency_.find(request.idempotency_key());
    if (it != idempotency_.end()) {
      response.set_prompt_set_id(it->second);
      response.set_duplicate(true);
      return response;
    }
  }
  prl::v1::LogRecord record;
  prl::v1::SubmittedPromptSet* submitted = record.mutable_submitted();
  PRL_RETURN_IF_ERROR(Validate(request, submitted->mutable_request()));
  const int64_t busy = PendingOrInFlightLocked();
  if (busy + request.prompts_size() > config_.max_pending_prompts) {
    return absl::ResourceExhaustedError(
        absl::StrCat(busy, " prompts are pending or in flight and this set adds ",
                     request.prompts_size(), "; the limit is ", config_.max_pending_prompts,
                     " (max_pending_prompts): retry when some have completed"));
  }
  std::string id;
  do {
    id = absl::StrCat("ps-", RandomHex().substr(0, 12));
  } while (sets_.count(id) > 0);
  submitted->set_prompt_set_id(id);
  submitted->set_created_unix_ms(absl::ToUnixMillis(absl::Now()));
  PRL_RETURN_IF_ERROR(log_->Append(record));
  Apply(record);
  CompactIfDueLocked();  // bounded log (coordinator_snapshot.cc)
  response.set_prompt_set_id(id);
  return response;
}

void Coordinator::Apply(const prl::v1::LogRecord& record) {
  if (record.has_submitted()) {
    const prl::v1::SubmittedPromptSet& s = record.submitted();
    PromptSet& set = sets_[s.prompt_set_id()];
    set.submitted = s;
    set.prompts.assign(s.request().prompts_size(), {});
    set.pending = s.request().prompts_size();
    set.samples = s.request().samples_per_prompt();
    set.min_tokens = s.request().prompts().empty() ? 0 : std::numeric_limits<int64_t>::max();
    for (const prl::v1::Prompt& prompt : s.request().prompts()) {
      set.max_tokens = std::max<int64_t>(set.max_tokens, prompt.tokens().ids_size());
      set.min_tokens = std::min<int64_t>(set.min_tokens, prompt.tokens().ids_size());
    }
    set.max_tokens += s.request().sampling().max_tokens();
    set.min_tokens += s.request().sampling().max_tokens();
    queue_.AddSet(s.prompt_set_id(), set.pending);
    order_.push_back(s.prompt_set_id());
    if (!s.request().idempotency_key().empty()) {
      idempotency_[s.request().idempotency_key()] = s.prompt_set_id();
    }
    ++stats_.prompt_sets;
  } else if (record.has_completed()) {
    auto it = sets_.find(record.completed().prompt_set_id());
    if (it == sets_.end()) return;
    PromptSet& set = it->second;
    const prl::v1::GroupResult& result = record.completed().result();
    PromptEntry& p = set.prompts[result.prompt_index()];
    if (p.state == PromptState::kDone || p.state == PromptState::kFailed) return;
    if (p.state == PromptState::kLeased) {
      --set.in_flight;
      leases_.erase(p.lease_id);
    } else {
      --set.pending;
    }
    p.state = PromptState::kDone;
    ++set.done;
    ++stats_.groups_completed;
    for (double r : result.rewards()) set.reward_sum += r;
    set.reward_count += result.rewards_size();
    FinishIfSettled(set);
    *set.events.emplace_back().mutable_group() = result;
    *set.events.emplace_back().mutable_status() = StatusOf(set);
  } else if (record.cancelled().size() > 0) {
    auto it = sets_.find(record.cancelled());
    if (it == sets_.end() || it->second.state != prl::v1::PROMPT_SET_STATE_RUNNING) return;
    it->second.state = prl::v1::PROMPT_SET_STATE_CANCELLED;
    *it->second.events.emplace_back().mutable_status() = StatusOf(it->second);
  } else if (record.has_failed_attempt()) {
    ApplyFailedAttempt(record.failed_attempt());  // prompt_attempts.cc
  }
  changed_.notify_all();
}

prl::v1::PromptSetStatus Coordinator::StatusOf(const PromptSet& set) const {
  prl::v1::PromptSetStatus s;
  s.set_prompt_set_id(set.submitted.prompt_set_id());
  s.set_name(set.submitted.request().name());
  s.set_state(set.state);
  s.set_prompts_total(static_cast<int64_t>(set.prompts.size()));
  s.set_prompts_pending(set.pending);
  s.set_prompts_in_flight(set.in_flight);
  s.set_prompts_done(set.done);
  s.set_mean_reward(set.reward_count > 0 ? set.reward_sum / set.reward_count : 0.0);
  s.set_created_unix_ms(set.submitted.created_unix_ms());
  s.set_samples_per_prompt(set.submitted.request().samples_per_prompt());
  s.set_prompts_failed(set.failed);
  for (const prl::v1::FailedPrompt& f : set.first_failed) *s.add_failed_prompts() = f;
  s.set_message(CapacityMessage(set));
  return s;
}

absl::StatusOr<prl::v1::PromptSetStatus> Coordinator::Get(const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = sets_.find(id);
  if (it == sets_.end()) return absl::NotFoundError(absl::StrCat("no prompt set '", id, "'"));
  return StatusOf(it->second);
}

std::vector<prl::v1::PromptSetStatus> Coordinator::List() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<prl::v1::PromptSetStatus> out;
  for (const std::string& id : order_) out.push_back(StatusOf(sets_.at(id)));
  return out;
}

absl::StatusOr<prl::v1::ListPromptSetsResponse> Coordinator::ListPage(
    const prl::v1::ListPromptSetsRequest& request) {
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
  if (first > order_.size()) {
    return Invalid("page_token", absl::StrCat("at most ", order_.size()), absl::StrCat(first));
  }
  prl::v1::ListPromptSetsResponse response;
  const size_t end = std::min(order_.size(), first + static_cast<size_t>(page));
  for (size_t i = first; i < end; ++i) *response.add_prompt_sets() = StatusOf(sets_.at(order_[i]));
  if (end < order_.size()) response.set_next_page_token(absl::StrCat(end));
  return response;
}

absl::Status Coordinator::CheckGroup(const prl::v1::CheckGroupRequest& request) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = sets_.find(request.prompt_set_id());
  const bool leased =
      it != sets_.end() && request.prompt_index() >= 0 &&
      request.prompt_index() < static_cast<int64_t>(it->second.prompts.size()) &&
      it->second.prompts[request.prompt_index()].state == PromptState::kLeased &&
      GroupIdOfLease(it->second.prompts[request.prompt_index()].lease_id) == request.group_id();
  if (leased) return absl::OkStatus();
  ++stats_.rejected_groups;
  return absl::FailedPreconditionError(absl::StrCat(
      "prompt ", request.prompt_index(), " of prompt set '", request.prompt_set_id(),
      "' has no open lease with group id ", request.group_id(), ": the group is refused"));
}

absl::StatusOr<prl::v1::PromptSetStatus> Coordinator::Cancel(const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = sets_.find(id);
  if (it == sets_.end()) return absl::NotFoundError(absl::StrCat("no prompt set '", id, "'"));
  if (it->second.state == prl::v1::PROMPT_SET_STATE_RUNNING) {
    prl::v1::LogRecord record;
    record.set_cancelled(id);
    PRL_RETURN_IF_ERROR(log_->Append(record));
    Apply(record);
  }
  return StatusOf(it->second);
}

absl::StatusOr<std::vector<prl::v1::PromptSetEvent>> Coordinator::WatchEvents(
    const std::string& id, size_t* cursor, absl::Duration timeout, bool* finished,
    bool include_texts) {
  std::unique_lock<std::mutex> lock(mu_);
  auto it = sets_.find(id);
  if (it == sets_.end()) return absl::NotFoundError(absl::StrCat("no prompt set '", id, "'"));
  std::vector<prl::v1::PromptSetEvent> out;
  if (*cursor == 0) {  // first call: the current status, then only what happens next
    *out.emplace_back().mutable_status() = StatusOf(it->second);
    *cursor = it->second.events.size() + 1;
  } else {
    // The set may be retired (coordinator_snapshot.cc) while this waits: look it up again.
    changed_.wait_for(lock, absl::ToChronoMilliseconds(timeout), [&] {
      it = sets_.find(id);
      return it == sets_.end() || it->second.events.size() + 1 > *cursor;
    });
    if (it == sets_.end()) return absl::NotFoundError(absl::StrCat("no prompt set '", id, "'"));
    const PromptSet& set = it->second;
    for (size_t i = *cursor - 1; i < set.events.size(); ++i) {
      out.push_back(set.events[i]);
      if (!include_texts && out.back().has_group()) out.back().mutable_group()->clear_texts();
    }
    *cursor = set.events.size() + 1;
  }
  *finished = it->second.state != prl::v1::PROMPT_SET_STATE_RUNNING;
  return out;
}

// ---- Actors -------------------------------------------------------------------------------

absl::StatusOr<prl::v1::RegisterResponse> Coordinator::RegisterActor(
    const std::string& name, const prl::v1::ActorCapacity& capacity) {
  std::lock_guard<std::mutex> lock(mu_);
  const absl::Time now = absl::Now();
  if (actors_.full()) ForgetDeadActorsLocked(now);
  PRL_ASSIGN_OR_RETURN(const std::string id, actors_.Register(name, capacity, now));
  prl::v1::RegisterResponse r;
  r.set_actor_id(id);
  r.set_lease_ms(config_.lease_ms);
  r.set_heartbeat_ms(config_.heartbeat_ms);
  return r;
}

absl::StatusOr<prl::v1::HeartbeatResponse> Coordinator::Heartbeat(
    const prl::v1::HeartbeatRequest& request) {
  std::lock_guard<std::mutex> lock(mu_);
  ActorTable::Actor* actor = actors_.Find(request.actor_id());
  if (actor == nullptr) {
    return absl::NotFoundError(absl::StrCat("unknown actor '", request.actor_id(),
                                            "': register again (the coordinator restarted?)"));
  }
  const absl::Time now = absl::Now();
  actor->last_seen = now;
  actor->weight_version = request.weight_version();
  // A heartbeat renews the leases the actor still holds and re-queues the ones it dropped.
  const absl::flat_hash_set<std::string> held(request.held_lease_ids().begin(),
                                              request.held_lease_ids().end());
  std::vector<std::pair<std::string, int64_t>> dropped;
  for (auto& [lease, where] : leases_) {
    PromptEntry& p = sets_[where.first].prompts[where.second];
    if (p.actor_id != request.actor_id()) continue;
    if (held.contains(lease)) {
      p.deadline = now + absl::Milliseconds(config_.lease_ms);
      earliest_deadline_ = std::min(earliest_deadline_, p.deadline);
    } else {
      dropped.push_back(where);
    }
  }
  // Logged, not waited for: nothing the reply says depends on it, and an fsync under the
  // mutex would stall every call (a failed log fails every later append, visibly).
  for (const auto& [set_id, index] : dropped) {
    FailAttemptLocked(
        sets_[set_id], index,
        absl::StrCat("dropped from the heartbeat of actor ", ActorName(request.actor_id())))
        .IgnoreError();
    ++stats_.leases_dropped;
  }
  prl::v1::HeartbeatResponse r;
  r.set_learner_version(budget_->learner_version());
  return r;
}

void Coordinator::Requeue(PromptSet& set, int64_t index) {
  PromptEntry& p = set.prompts[index];
  leases_.erase(p.lease_id);
  p.state = PromptState::kPending;
  p.lease_id.clear();
  p.actor_id.clear();
  p.deadline = absl::Time();
  --set.in_flight;
  ++set.pending;
  queue_.AddRerun(set.submitted.prompt_set_id(), index);
}

absl::StatusOr<uint64_t> Coordinator::ExpireLocked(absl::Time now) {
  // Every Lease call comes here: a scan only once the earliest deadline may have passed.
  if (now <= earliest_deadline_) return uint64_t{0};
  std::vector<std::pair<std::string, int64_t>> expired;
  earliest_deadline_ = absl::InfiniteFuture();
  for (const auto& [lease, where] : leases_) {
    const absl::Time deadline = sets_[where.first].prompts[where.second].deadline;
    if (deadline < now) {
      expired.push_back(where);
    } else {
      earliest_deadline_ = std::min(earliest_deadline_, deadline);
    }
  }
  absl::StatusOr<uint64_t> logged = uint64_t{0};
  for (const auto& [set_id, index] : expired) {
    PromptSet& set = sets_[set_id];
    logged = FailAttemptLocked(
        set, index,
        absl::StrCat("lease expired: actor ", ActorName(set.prompts[index].actor_id),
                     " neither completed nor renewed it within lease_ms"));
    ++stats_.leases_expired;
  }
  return logged;
}

void Coordinator::ForgetDeadActorsLocked(absl::Time now) {
  absl::flat_hash_set<std::string> holding;
  for (const auto& [lease, where] : leases_) {
    holding.insert(sets_[where.first].prompts[where.second].actor_id);
  }
  actors_.Forget(now, [&](const std::string& actor) { return holding.contains(actor); });
}

void Coordinator::ExpireLeases() {
  std::unique_lock<std::mutex> lock(mu_);
  const absl::StatusOr<uint64_t> logged = ExpireLocked(absl::Now());
  ForgetDeadActorsLocked(absl::Now());
  RetireFinishedLocked(absl::Now());  // retention (coordinator_snapshot.cc)
  lock.unlock();  // the fsync is waited for without the mutex: other calls go on meanwhile
  if (!logged.ok() || *logged != 0) AwaitLogged(logged).IgnoreError();
}

absl::StatusOr<prl::v1::LeaseResponse> Coordinator::Lease(const prl::v1::LeaseRequest& request) {
  std::lock_guard<std::mutex> lock(mu_);
  ActorTable::Actor* actor = actors_.Find(request.actor_id());
  if (actor == nullptr) {
    return absl::NotFoundError(absl::StrCat("unknown actor '", request.actor_id(),
                                            "': register again (the coordinator restarted?)"));
  }
  const absl::Time now = absl::Now();
  actor->last_seen = now;
  // Expiries are logged, not waited for (the background ExpireLeases reports a failed log).
  ExpireLocked(now).IgnoreError();
  int64_t allowed = budget_->Allowed(request.max_prompts(), static_cast<int64_t>(leases_.size()),
                                     stats_.groups_completed);
  if (allowed < request.max_prompts() && !queue_.empty()) ++stats_.lease_requests_throttled;
  prl::v1::LeaseResponse response;
  if (config_.sync) response.set_min_weight_version(budget_->learner_version());
  // Prompts beyond the actor's capacity keep their place for others (capacity.h); a set none
  // of whose prompts fit is passed over whole (pending_queue.h).
  const prl::v1::ActorCapacity& capacity = actor->capacity;
  const auto visit_set = [&](const std::string& set_id) {
    const PromptSet& set = sets_[set_id];
    if (set.state != prl::v1::PROMPT_SET_STATE_RUNNING) return PendingQueue::SetVisit::kDrop;
    return Fits(capacity, {set.samples, set.min_tokens}) ? PendingQueue::SetVisit::kLook
                                                         : PendingQueue::SetVisit::kPass;
  };
  const auto visit = [&](const std::string& set_id, int64_t index) {
    if (allowed <= 0) return PendingQueue::Visit::kStop;
    PromptSet& set = sets_[set_id];
    PromptEntry& p = set.prompts[index];
    if (set.state != prl::v1::PROMPT_SET_STATE_RUNNING || p.state != PromptState::kPending) {
      return PendingQueue::Visit::kDrop;  // stale
    }
    const GroupShape shape{set.samples, set.submitted.request().prompts(index).tokens().ids_size() +
                                            set.submitted.request().sampling().max_tokens()};
    if (!Fits(capacity, shape)) return PendingQueue::Visit::kKeep;
    p.state = PromptState::kLeased;
    p.lease_id = LeaseId(set_id, index);
    p.actor_id = request.actor_id();
    p.deadline = now + absl::Milliseconds(config_.lease_ms);
    earliest_deadline_ = std::min(earliest_deadline_, p.deadline);
    leases_[p.lease_id] = {set_id, index};
    --set.pending;
    ++set.in_flight;
    const prl::v1::SubmitPromptSetRequest& req = set.submitted.request();
    prl::v1::LeasedPrompt* out = response.add_prompts();
    out->set_lease_id(p.lease_id);
    out->set_prompt_set_id(set_id);
    out->set_prompt_index(index);
    *out->mutable_prompt_tokens() = req.prompts(index).tokens().ids();
    out->set_reference(req.prompts(index).reference());
    out->set_samples(req.samples_per_prompt());
    *out->mutable_sampling() = req.sampling();
    *out->mutable_reward() = req.reward();
    // A re-run of a group that came in too stale starts from the learner's newest weights: the
    // actor's own delay in taking new weights is no longer part of its lag.
    if (p.stale_reruns > 0) response.set_min_weight_version(budget_->learner_version());
    --allowed;
    return PendingQueue::Visit::kTake;
  };
  if (allowed > 0) queue_.Scan(visit_set, visit);
  if (response.prompts_size() > 0) stats_.prompts_leased[actor->name] += response.prompts_size();
  return response;
}

absl::StatusOr<prl::v1::LearnerProgressResponse> Coordinator::LearnerProgress(
    int64_t version, int64_t groups_consumed, int64_t groups_waiting,
    const prl::v1::LearnerProgressResponse* seen) {
  std::lock_guard<std::mutex> lock(mu_);
  absl::StatusOr<prl::v1::LearnerProgressResponse> response =
      budget_->Report(version, groups_consumed, groups_waiting, seen, stats_.groups_completed);
  if (!response.ok()) {
    ++stats_.rejected_progress;
    return response;
  }
  // The sets retired since the echoed reply (of this coordinator), else every one it still
  // remembers: a report is answered with what the learner has not heard yet.
  const int64_t retired = stats_.sets_retired;
  int64_t unseen = static_cast<int64_t>(recently_retired_.size());
  if (seen != nullptr && seen->coordinator_start() == response->coordinator_start() &&
      seen->sets_retired() <= retired) {
    unseen = std::min(unseen, retired - seen->sets_retired());
  }
  for (auto it = recently_retired_.end() - unseen; it != recently_retired_.end(); ++it) {
    response->add_retired_prompt_sets(*it);
  }
  response->set_sets_retired(retired);
  return response;
}

CoordinatorStats Coordinator::Stats() {
  std::lock_guard<std::mutex> lock(mu_);
  CoordinatorStats s = stats_;
  s.actors = actors_.size();
  s.learner_version = budget_->learner_version();
  s.groups_consumed = budget_->groups_consumed();
  s.groups_unconsumed = budget_->Unconsumed(stats_.groups_completed);
  s.prompts_pending = s.prompts_in_flight = s.prompts_done = 0;
  for (const auto& [id, set] : sets_) {
    s.prompts_pending += set.state == prl::v1::PROMPT_SET_STATE_RUNNING ? set.pending : 0;
    s.prompts_in_flight += set.in_flight;
    s.prompts_done += set.done;
  }
  return s;
}

}  // namespace prl::coordinator
