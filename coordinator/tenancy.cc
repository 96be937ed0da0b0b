// Tenants and their adapters (declared in coordinator.h): a submission's adapter found or
// made, the tenants' quotas and visibility, deleting an adapter, and the learner's per-adapter
// progress. The adapters and their budgets are coordinator/adapters.h's; what a tenant may do
// is coordinator/tenants.h's.
#include <algorithm>
#include <vector>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "coordinator/coordinator.h"
#include "coordinator/field_error.h"
#include "coordinator/ids.h"
#include "core/adapter_names.h"
#include "core/status_macros.h"

namespace prl::coordinator {

namespace {

// Whether a submission names its adapter alone (an existing one, or a new one with the run's
// settings).
bool NamedAlone(const prl::v1::AdapterSpec& s) {
  return s.rank() == 0 && s.alpha() == 0 && !s.rslora() && s.target_modules().empty() &&
         s.learning_rate() == 0;
}

// The first setting in which `found` (resolved) differs from the adapter's, or "".
std::string FirstDifference(const prl::v1::AdapterSpec& have, const prl::v1::AdapterSpec& found,
                            std::string* expected, std::string* got) {
  const auto differ = [&](const char* field, std::string a, std::string b) {
    *expected = std::move(a);
    *got = std::move(b);
    return std::string(field);
  };
  if (have.rank() != found.rank()) {
    return differ("rank", absl::StrCat(have.rank()), absl::StrCat(found.rank()));
  }
  if (have.alpha() != found.alpha()) {
    return differ("alpha", absl::StrCat(have.alpha()), absl::StrCat(found.alpha()));
  }
  if (have.rslora() != found.rslora()) {
    return differ("rslora", have.rslora() ? "true" : "false", found.rslora() ? "true" : "false");
  }
  const std::vector<std::string> a(have.target_modules().begin(), have.target_modules().end());
  const std::vector<std::string> b(found.target_modules().begin(), found.target_modules().end());
  if (a != b) return differ("target_modules", absl::StrJoin(a, ","), absl::StrJoin(b, ","));
  if (have.learning_rate() != found.learning_rate()) {
    return differ("learning_rate", absl::StrCat(have.learning_rate()),
                  absl::StrCat(found.learning_rate()));
  }
  return "";
}

}  // namespace

absl::Status Coordinator::ValidateAdapter(const prl::v1::SubmitPromptSetRequest& request,
                                          prl::v1::AdapterSpec* resolved) const {
  if (!request.has_adapter()) {
    if (!config_.adapters) return absl::OkStatus();
    return Invalid("adapter.name",
                   "the adapter this set trains (this run trains adapters: coordinator.adapters)",
                   "none");
  }
  const prl::v1::AdapterSpec& a = request.adapter();
  if (!config_.adapters) {
    return Invalid("adapter",
                   "unset (this run trains one model; adapters need coordinator.adapters)",
                   absl::StrCat("adapter '", a.name().substr(0, 64), "'"));
  }
  PRL_RETURN_IF_ERROR(ValidateAdapterName(a.name(), "adapter.name"));
  if (a.rank() < 0 || a.rank() > config_.max_adapter_rank) {
    return Invalid("adapter.rank",
                   absl::StrCat("0 (learner.lora_rank) or 1 to ", config_.max_adapter_rank,
                                " (coordinator.max_adapter_rank)"),
                   absl::StrCat(a.rank()));
  }
  if (!std::isfinite(a.alpha()) || a.alpha() < 0) {
    return Invalid("adapter.alpha", "0 (learner.lora_alpha) or a finite number > 0",
                   absl::StrCat(a.alpha()));
  }
  if (!std::isfinite(a.learning_rate()) || a.learning_rate() < 0 || a.learning_rate() > 1) {
    return Invalid("adapter.learning_rate", "0 (learner.lr) or in (0, 1]",
                   absl::StrCat(a.learning_rate()));
  }
  if (a.target_modules_size() > kMaxAdapterTargets) {
    return Invalid("adapter.target_modules", absl::StrCat("at most ", kMaxAdapterTargets, " names"),
                   absl::StrCat(a.target_modules_size()));
  }
  for (int i = 0; i < a.target_modules_size(); ++i) {
    const std::string& t = a.target_modules(i);
    if (!IsAdapterTarget(t)) {
      return Invalid(absl::StrCat("adapter.target_modules[", i, "]"),
                     absl::StrCat("one of ", absl::StrJoin(kAdapterTargets, ", ")),
                     absl::StrCat("'", t.substr(0, 64), "'"));
    }
  }
  *resolved = a;
  const prl::v1::AdapterSpec& d = config_.adapter_defaults;
  if (a.rank() == 0) resolved->set_rank(d.rank());
  if (a.alpha() == 0) resolved->set_alpha(d.alpha());
  resolved->set_rslora(a.rslora() || d.rslora());  // rsLoRA when asked or the run's default
  if (a.target_modules().empty()) *resolved->mutable_target_modules() = d.target_modules();
  if (a.learning_rate() == 0) resolved->set_learning_rate(d.learning_rate());
  // What a new adapter would be, defaults included, is checked (an existing one named alone
  // takes the existing settings instead: AdmitLocked).
  if (resolved->rank() < 1 || resolved->rank() > config_.max_adapter_rank) {
    return Invalid("adapter.rank",
                   absl::StrCat("1 to ", config_.max_adapter_rank,
                                " (coordinator.max_adapter_rank; unset: learner.lora_rank)"),
                   absl::StrCat(resolved->rank()));
  }
  if (config_.validate_adapter) {
    if (absl::Status s = config_.validate_adapter(*resolved); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("adapter: ", s.message()));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::optional<prl::v1::LogRecord>> Coordinator::AdmitLocked(
    const Caller& caller, const prl::v1::AdapterSpec& asked,
    prl::v1::SubmittedPromptSet* submitted) const {
  const prl::v1::SubmitPromptSetRequest& request = submitted->request();
  submitted->set_tenant(caller.tenant);
  const TenantLimits* limits = nullptr;
  if (!caller.operator_()) {
    auto it = config_.tenants.find(caller.tenant);
    if (it == config_.tenants.end()) {
      return absl::PermissionDeniedError(
          absl::StrCat("tenant '", caller.tenant,
                       "' has no limits in coordinator.tenants: it may submit nothing"));
    }
    limits = &it->second;
    if (!request.has_adapter()) {
      return Invalid("adapter.name", "one of the tenant's adapters (a tenant trains adapters only)",
                     "none");
    }
    PRL_RETURN_IF_ERROR(CheckAdapterAllowed(caller.tenant, *limits, request.adapter().name()));
    int64_t running = 0, busy = 0;
    for (const std::string& id : sets_.order()) {
      const PromptSets::Set* set = sets_.Find(id);
      if (set->running() && set->submitted.tenant() == caller.tenant) {
        ++running;
        busy += set->pending + set->in_flight;
      }
    }
    if (limits->max_prompt_sets > 0 && running + 1 > limits->max_prompt_sets) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "tenant '", caller.tenant, "' has ", running, " running prompt sets; its quota is ",
          limits->max_prompt_sets, " (coordinator.tenants.", caller.tenant,
          ".max_prompt_sets): retry when one is done or cancelled"));
    }
    if (limits->max_prompts_in_flight > 0 &&
        busy + request.prompts_size() > limits->max_prompts_in_flight) {
      return absl::ResourceExhaustedError(
          absl::StrCat("tenant '", caller.tenant, "' has ", busy,
                       " prompts pending or in flight and this set adds ", request.prompts_size(),
                       "; its quota is ", limits->max_prompts_in_flight, " (coordinator.tenants.",
                       caller.tenant, ".max_prompts_in_flight)"));
    }
  }
  if (!request.has_adapter()) return std::nullopt;
  const prl::v1::AdapterSpec& spec = request.adapter();
  if (const Adapters::Adapter* known = adapters_.ByName(spec.name())) {
    if (!caller.Sees(known->status.tenant())) {
      // The very error of a name the tenant may not train: another tenant's adapter is not
      // revealed.
      return AdapterRefused(caller.tenant, *limits, spec.name());
    }
    std::string expected, found;
    const std::string field = FirstDifference(known->status.spec(), spec, &expected, &found);
    if (!field.empty() && !NamedAlone(asked)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "adapter.", field, ": the adapter '", spec.name(), "' exists with ", field, " ", expected,
          ", found ", found, " (name it alone to train it, or delete it first)"));
    }
    submitted->set_adapter_id(known->status.adapter_id());
    *submitted->mutable_request()->mutable_adapter() = known->status.spec();
    return std::nullopt;
  }
  if (adapters_.size() >= config_.max_adapters) {
    // A tenant is not told how many adapters the others have.
    return absl::ResourceExhaustedError(
        caller.operator_()
            ? absl::StrCat(adapters_.size(), " adapters exist; the limit is ", config_.max_adapters,
                           " (coordinator.max_adapters): delete one first")
            : std::string("the coordinator holds as many adapters as it may "
                          "(coordinator.max_adapters): ask its operator"));
  }
  if (limits != nullptr && limits->max_adapters > 0 &&
      adapters_.CreatedBy(caller.tenant) >= limits->max_adapters) {
    return absl::ResourceExhaustedError(
        absl::StrCat("tenant '", caller.tenant, "' has ", adapters_.CreatedBy(caller.tenant),
                     " adapters; its quota is ", limits->max_adapters, " (coordinator.tenants.",
                     caller.tenant, ".max_adapters): delete one first"));
  }
  prl::v1::LogRecord record;
  prl::v1::AdapterStatus* created = record.mutable_adapter_created();
  std::string id;
  do {
    id = absl::StrCat("ad-", RandomHex().substr(0, 12));
  } while (adapters_.ById(id) != nullptr);
  created->set_adapter_id(id);
  *created->mutable_spec() = spec;
  created->set_tenant(caller.tenant);
  created->set_created_unix_ms(absl::ToUnixMillis(absl::Now()));
  // Its learner rank: the one with the fewest live adapters (the lowest on a tie), kept for its
  // life (the record holds it).
  std::vector<int64_t> placed(static_cast<size_t>(std::max(1, config_.learner_ranks)), 0);
  for (const std::string& other : adapters_.order()) {
    const int32_t rank = adapters_.ById(other)->status.learner_rank();
    if (rank >= 0 && rank < static_cast<int32_t>(placed.size())) ++placed[rank];
  }
  created->set_learner_rank(static_cast<int32_t>(
      std::min_element(placed.begin(), placed.end()) - placed.begin()));
  submitted->set_adapter_id(id);
  return record;
}

const PromptSets::Set* Coordinator::VisibleSetLocked(const std::string& id,
                                                     const Caller& caller) const {
  const PromptSets::Set* set = sets_.Find(id);
  return set != nullptr && caller.Sees(set->submitted.tenant()) ? set : nullptr;
}

Adapters::Adapter* Coordinator::BudgetAdapterLocked(const PromptSets::Set& set) {
  if (set.eval() || set.submitted.adapter_id().empty()) return nullptr;
  return adapters_.MutableById(set.submitted.adapter_id());
}

int64_t Coordinator::AdapterInFlightLocked(const Adapters::Adapter& adapter) const {
  int64_t n = 0;
  for (const std::string& id : adapter.sets) {
    const PromptSets::Set* set = sets_.Find(id);
    if (set != nullptr && !set->eval()) n += set->in_flight;
  }
  return n;
}

prl::v1::ListAdaptersResponse Coordinator::ListAdapters(const Caller& caller) {
  std::lock_guard<std::mutex> lock(mu_);
  prl::v1::ListAdaptersResponse response;
  for (const std::string& id : adapters_.order()) {
    const Adapters::Adapter& a = *adapters_.ById(id);
    if (!caller.Sees(a.status.tenant())) continue;
    prl::v1::AdapterStatus* out = response.add_adapters();
    *out = a.status;
    if (a.budget.has_value()) {
      out->set_version(a.budget->learner_version());
      out->set_groups_consumed(a.budget->groups_consumed());
    }
    int64_t running = 0;
    for (const std::string& set_id : a.sets) {
      const PromptSets::Set* set = sets_.Find(set_id);
      running += set != nullptr && set->running() ? 1 : 0;
    }
    out->set_prompt_sets_running(running);
    out->set_prompts_in_flight(AdapterInFlightLocked(a));
  }
  return response;
}

absl::StatusOr<prl::v1::DeleteAdapterResponse> Coordinator::DeleteAdapter(const std::string& name,
                                                                          const Caller& caller) {
  std::unique_lock<std::mutex> lock(mu_);
  const Adapters::Adapter* adapter = adapters_.ByName(name);
  if (adapter == nullptr || !caller.Sees(adapter->status.tenant())) {
    return absl::NotFoundError(absl::StrCat("no adapter '", name.substr(0, 64), "'"));
  }
  prl::v1::DeleteAdapterResponse response;
  const std::string adapter_id = adapter->status.adapter_id();
  response.set_adapter_id(adapter_id);
  // Its running sets are cancelled first (each durable before the deletion), so that a replay
  // never finds a running set of an unknown adapter.
  const std::vector<std::string> sets(adapter->sets.begin(), adapter->sets.end());
  uint64_t ticket = 0;
  for (const std::string& id : sets) {
    const PromptSets::Set* set = sets_.Find(id);
    if (set == nullptr || !set->running()) continue;
    prl::v1::LogRecord cancelled;
    cancelled.set_cancelled(id);
    PRL_ASSIGN_OR_RETURN(ticket, log_->Write(cancelled));
    Apply(cancelled);
    response.set_prompt_sets_cancelled(response.prompt_sets_cancelled() + 1);
  }
  prl::v1::LogRecord deleted;
  deleted.set_adapter_deleted(adapter_id);
  PRL_ASSIGN_OR_RETURN(ticket, log_->Write(deleted));
  Apply(deleted);
  lock.unlock();  // the fsync is waited for without the mutex
  PRL_RETURN_IF_ERROR(log_->WaitDurable(ticket));
  return response;
}

absl::Status Coordinator::AdapterProgressLocked(const prl::v1::LearnerProgressRequest& request,
                                                prl::v1::LearnerProgressResponse* response) {
  // Every part is checked before any is taken: a refused report changes nothing.
  for (const prl::v1::AdapterProgress& p : request.adapters()) {
    const Adapters::Adapter* a = adapters_.ById(p.adapter_id());
    if (a == nullptr || !a->budget.has_value()) continue;
    if (absl::Status s = a->budget->Check(p.version(), p.groups_consumed(), p.groups_waiting());
        !s.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat("adapter ", p.adapter_id().substr(0, 64), ": ", s.message()));
    }
  }
  for (const prl::v1::AdapterProgress& p : request.adapters()) {
    Adapters::Adapter* a = adapters_.MutableById(p.adapter_id());
    if (a == nullptr || !a->budget.has_value()) continue;  // deleted: the learner frees it
    // The echo of this adapter's completions in the learner's previous reply; none: the
    // adapter's first report (it was created after that reply).
    std::optional<prl::v1::LearnerProgressResponse> seen;
    if (request.has_seen()) {
      for (const prl::v1::AdapterCompletions& c : request.seen().adapter_completions()) {
        if (c.adapter_id() != p.adapter_id()) continue;
        seen.emplace();
        seen->set_completions(c.completions());
        seen->set_coordinator_start(request.seen().coordinator_start());
      }
    }
    PRL_RETURN_IF_ERROR(a->budget
                            ->Report(p.version(), p.groups_consumed(), p.groups_waiting(),
                                     seen.has_value() ? &*seen : nullptr, a->completions)
                            .status());  // checked above
  }
  for (const std::string& id : adapters_.order()) {
    prl::v1::AdapterCompletions* c = response->add_adapter_completions();
    c->set_adapter_id(id);
    c->set_completions(adapters_.ById(id)->completions);
    *c->mutable_spec() = adapters_.ById(id)->status.spec();
    c->set_learner_rank(adapters_.ById(id)->status.learner_rank());
  }
  return absl::OkStatus();
}

}  // namespace prl::coordinator
