// Actors and leases (declared in coordinator.h): registration, heartbeats, leasing prompts
// within an actor's capacity and the lag budget, and expiry. The lease table
// (coordinator/lease_table.h) and the actor table (coordinator/actor_table.h) own the state;
// a lease that ends without its group is a failed attempt (prompt_attempts.cc), logged without
// waiting for its fsync while the mutex is held.
#include <algorithm>
#include <map>
#include <set>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "coordinator/capacity.h"
#include "coordinator/coordinator.h"
#include "coordinator/lease_scheduler.h"
#include "core/status_macros.h"

namespace prl::coordinator {

namespace {

// A lease response stops growing past this (one prompt is at most a few MiB: every submission
// field is bounded, submission.cc).
constexpr size_t kMaxLeaseResponseBytes = size_t{16} << 20;

absl::Status UnknownActor(const std::string& actor_id) {
  return absl::NotFoundError(
      absl::StrCat("unknown actor '", actor_id, "': register again (the coordinator restarted?)"));
}

}  // namespace

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
  if (actor == nullptr) return UnknownActor(request.actor_id());
  const absl::Time now = absl::Now();
  actor->last_seen = now;
  actor->weight_version = request.weight_version();
  // A heartbeat renews the leases the actor still holds and re-queues the ones it dropped.
  const absl::flat_hash_set<std::string> held(request.held_lease_ids().begin(),
                                              request.held_lease_ids().end());
  // Logged, not waited for: nothing the reply says depends on it, and an fsync under the
  // mutex would stall every call (a failed log fails every later append, visibly).
  for (const PromptRef& dropped : leases_.Renew(request.actor_id(), held, now)) {
    FailAttemptLocked(dropped, absl::StrCat("dropped from the heartbeat of actor ",
                                            ActorName(request.actor_id())))
        .IgnoreError();
    ++stats_.leases_dropped;
  }
  prl::v1::HeartbeatResponse r;
  r.set_learner_version(budget_->learner_version());
  // Leases it lists that are not its own (any more): it abandons their groups at once.
  for (const std::string& id : request.held_lease_ids()) {
    const LeaseTable::Lease* lease = leases_.Find(id);
    if (lease == nullptr || lease->actor_id != request.actor_id()) r.add_lost_lease_ids(id);
  }
  // A class of prompt sets above its fair share while others wait gives leases back, the
  // newest first (the least work lost).
  const FairShare share = FairShareLocked(request.actor_id(), *actor);
  for (const auto& [klass, n] : share.ToReclaim()) {
    std::vector<std::pair<absl::Time, std::string>> of_class;
    for (const auto& [id, lease] : leases_.HeldBy(request.actor_id())) {
      const PromptSets::Set* set = sets_.Find(lease->prompt.set_id);
      if (set != nullptr && ShareClassOf(set->submitted.request()) == klass) {
        of_class.emplace_back(lease->opened, id);
      }
    }
    std::sort(of_class.rbegin(), of_class.rend());
    for (int64_t i = 0; i < n && i < static_cast<int64_t>(of_class.size()); ++i) {
      r.add_reclaim_lease_ids(of_class[i].second);
      leases_.MarkReclaimAsked(of_class[i].second);
    }
  }
  return r;
}

FairShare Coordinator::FairShareLocked(const std::string& actor_id,
                                       const ActorTable::Actor& actor) const {
  const int32_t slots = actor.capacity.max_prompts_in_flight();
  if (slots <= 0) return FairShare(0, {}, {});  // an actor that did not say: nothing is limited
  std::map<std::string, int64_t> held;
  for (const auto& [id, lease] : leases_.HeldBy(actor_id)) {
    const PromptSets::Set* set = sets_.Find(lease->prompt.set_id);
    if (set != nullptr) ++held[ShareClassOf(set->submitted.request())];
  }
  std::set<std::string> waiting;
  for (const std::string& id : sets_.order()) {
    const PromptSets::Set* set = sets_.Find(id);
    if (set == nullptr || !set->running() || set->pending == 0 ||
        !Fits(actor.capacity, {set->samples, set->min_tokens})) {
      continue;
    }
    waiting.insert(ShareClassOf(set->submitted.request()));
  }
  return FairShare(slots, std::move(held), std::move(waiting));
}

absl::StatusOr<uint64_t> Coordinator::ExpireLocked(absl::Time now) {
  absl::StatusOr<uint64_t> logged = uint64_t{0};
  for (const PromptRef& expired : leases_.Expired(now)) {
    const LeaseTable::Lease* lease = leases_.Find(*leases_.IdOf(expired));
    logged = FailAttemptLocked(expired,
                               absl::StrCat("lease expired: actor ", ActorName(lease->actor_id),
                                            " neither completed nor renewed it within lease_ms"));
    ++stats_.leases_expired;
  }
  return logged;
}

void Coordinator::ForgetDeadActorsLocked(absl::Time now) {
  const absl::flat_hash_set<std::string> holding = leases_.Holders();
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
  if (actor == nullptr) return UnknownActor(request.actor_id());
  const absl::Time now = absl::Now();
  actor->last_seen = now;
  // Expiries are logged, not waited for (the background ExpireLeases reports a failed log).
  ExpireLocked(now).IgnoreError();
  OpenDueEvalRoundsLocked();  // (evaluation.cc)
  // Training prompts within their lag budget (the model's, or in a run of adapters each
  // adapter's own: adapters.h); evaluation prompts (never trained on) outside it, within the
  // actor's evaluation share (evaluation.cc).
  int64_t slots = request.max_prompts();
  int64_t model_allowed = budget_->Allowed(
      request.max_prompts(), leases_.size() - sets_.EvalInFlight(), sets_.counts().groups_completed);
  std::map<std::string, int64_t> adapter_allowed;  // by adapter id, on first use
  int64_t eval_allowed = EvalLeasesAllowedLocked(request.actor_id(), *actor);
  bool throttled = false;
  // The budget a set's leases count against.
  const auto allowed_for = [&](const PromptSets::Set& set) -> int64_t& {
    if (set.eval()) return eval_allowed;
    Adapters::Adapter* adapter = BudgetAdapterLocked(set);
    if (adapter == nullptr) return model_allowed;
    auto [it, added] = adapter_allowed.try_emplace(adapter->status.adapter_id(), 0);
    if (added) {
      it->second = adapter->budget->Allowed(request.max_prompts(), AdapterInFlightLocked(*adapter),
                                            adapter->completions);
    }
    return it->second;
  };
  prl::v1::LeaseResponse response;
  if (config_.sync) response.set_min_weight_version(budget_->learner_version());
  // Prompts beyond the actor's capacity keep their place for others (capacity.h); a set none
  // of whose prompts fit is passed over whole (lease_scheduler.h). While other classes of sets
  // wait, none takes more than its fair share of the actor (fair_share.h).
  const prl::v1::ActorCapacity& capacity = actor->capacity;
  FairShare share = FairShareLocked(request.actor_id(), *actor);
  using SetCheck = LeaseScheduler::SetCheck;
  using PromptCheck = LeaseScheduler::PromptCheck;
  const auto check_set = [&](const std::string& set_id) {
    const PromptSets::Set* set = sets_.Find(set_id);
    if (set == nullptr || !set->running()) return SetCheck::kDrop;
    if (!Fits(capacity, {set->samples, set->min_tokens})) return SetCheck::kPass;
    if (allowed_for(*set) <= 0) {
      throttled |= !set->eval();
      return SetCheck::kPass;
    }
    return share.Blocked(ShareClassOf(set->submitted.request())) ? SetCheck::kWait
                                                                 : SetCheck::kOpen;
  };
  const auto check_prompt = [&](const std::string& set_id, int64_t index) {
    const PromptSets::Set& set = *sets_.Find(set_id);  // open: known and running
    if (set.prompts[index].state != PromptState::kPending) return PromptCheck::kDrop;  // stale
    const GroupShape shape{set.samples, set.submitted.request().prompts(index).tokens().ids_size() +
                                            set.submitted.request().sampling().max_tokens()};
    return Fits(capacity, shape) ? PromptCheck::kRuns : PromptCheck::kKeep;
  };
  LeaseScheduler::Round round = scheduler_.StartRound(check_set, check_prompt);
  size_t response_bytes = 0;
  // A response stays well within any actor's receive limit (64 MiB): the rest next time.
  while (slots > 0 && response_bytes <= kMaxLeaseResponseBytes) {
    const std::optional<PromptRef> next = round.Next();
    if (!next.has_value()) break;
    const PromptSets::Set& set = *sets_.Find(next->set_id);
    share.MayTake(ShareClassOf(set.submitted.request()));  // open: below its share
    sets_.MarkLeased(next->set_id, next->index);
    throughput_.Leased(set.submitted.request().name());
    prl::v1::LeasedPrompt* out = response.add_prompts();
    out->set_lease_id(leases_.Open(*next, request.actor_id(), now));
    PromptSets::FillLease(set, next->index, out);
    // The set's adapter (an evaluation set's too): the learner rank that serves its versions.
    const Adapters::Adapter* adapter =
        set.submitted.adapter_id().empty() ? nullptr : adapters_.ById(set.submitted.adapter_id());
    if (adapter != nullptr)
      out->mutable_adapter()->set_learner_rank(adapter->status.learner_rank());
    // A re-run of a group that came in too stale starts from the learner's newest weights: the
    // actor's own delay in taking new weights is no longer part of its lag. The same for an
    // adapter's prompt, with the adapter's newest version (and always in sync mode).
    const bool rerun = set.prompts[next->index].stale_reruns > 0;
    if (adapter != nullptr && !set.eval()) {  // (BudgetAdapterLocked's adapter, found once)
      if (rerun || config_.sync) out->mutable_adapter()->set_min_version(adapter->budget->learner_version());
    } else if (rerun) {
      response.set_min_weight_version(budget_->learner_version());
    }
    --allowed_for(set);
    --slots;
    response_bytes += out->ByteSizeLong();
  }
  if (throttled) ++stats_.lease_requests_throttled;
  if (response.prompts_size() > 0) stats_.prompts_leased[actor->name] += response.prompts_size();
  return response;
}

}  // namespace prl::coordinator
