// Adapters: the LoRA adapters a run of tenants trains on its shared base model (docs/
// tenants.md) — the registry by name and id, each adapter's prompt sets, its completions and
// its own max_lag budget (coordinator/lag_budget.h) with the learner's newest version of it.
//
// A prompt set names its adapter (SubmitPromptSetRequest.adapter): the first set that names one
// creates it (an AdapterCreated record), later sets name it again; DeleteAdapter cancels its
// running sets and drops it (an AdapterDeleted record), and a later set may make the name again
// as a new adapter with a new id. Every change comes from a log record the coordinator has
// written (the same calls replay the log at open), except the budgets' learner reports, which
// are not durable (the learner reports again).
//
// Each adapter's budget is the coordinator's rule for one model, applied to the adapter's sets
// alone: its prompts in flight plus its groups completed and not yet trained on stay within
// (max_lag + 1) * groups_per_step, so that one tenant's backlog never holds back another's.
//
// Not thread-safe: the coordinator calls it under its mutex.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "coordinator/lag_budget.h"
#include "prl/v1/prompt.pb.h"

namespace prl::coordinator {

class Adapters {
 public:
  struct Adapter {
    prl::v1::AdapterStatus status;  // id, spec (defaults filled in), tenant, creation time
    std::set<std::string> sets;     // its prompt sets' ids (running or finished, not retired)
    int64_t completions = 0;        // its sets' groups completed since open (replay included)
    std::optional<LagBudget> budget;  // from Start on
  };
  // The budget's settings, as the coordinator's (CoordinatorConfig).
  struct BudgetSettings {
    int64_t max_lag = 0, groups_per_step = 0;
    bool sync = false;
  };

  // ---- Records (live and replayed) ----
  void ApplyCreated(const prl::v1::AdapterStatus& created);
  void ApplyDeleted(const std::string& adapter_id);
  // A set of the adapter was submitted, or retired.
  void AddSet(const std::string& adapter_id, const std::string& set_id);
  // Retired sets (their ids) leave their adapters.
  void RemoveSets(const std::function<bool(const std::string&)>& is_removed);
  // One of the adapter's groups completed, or a completed one was handed back by the learner.
  void Completed(const std::string& adapter_id);
  void HandedBack(const std::string& adapter_id);

  // The budgets start after the log's replay (each counts its completions from there);
  // adapters created later start theirs at once. `start_unix_ns`: the coordinator's start (its
  // replies to the learner carry it).
  void Start(const BudgetSettings& settings, uint64_t start_unix_ns);

  // ---- Reading ----
  const Adapter* ByName(const std::string& name) const;
  const Adapter* ById(const std::string& adapter_id) const;
  Adapter* MutableById(const std::string& adapter_id);
  // Adapter ids in creation order.
  const std::vector<std::string>& order() const { return order_; }
  int64_t size() const { return static_cast<int64_t>(by_id_.size()); }
  // Adapters the tenant created (its quota's count).
  int64_t CreatedBy(const std::string& tenant) const;

  // The live adapters as log records (AdapterCreated), for the log's compaction: they come
  // before the sets' records.
  std::vector<prl::v1::LogRecord> Snapshot() const;

 private:
  std::map<std::string, Adapter> by_id_;
  std::map<std::string, std::string> id_by_name_;
  std::vector<std::string> order_;
  std::optional<BudgetSettings> settings_;  // set by Start
  uint64_t start_unix_ns_ = 0;
};

// Checks an adapter's name: 1 to 64 characters of [a-z0-9._-], starting with a letter or a
// digit (it names files and a metric label). The error names `field`.
absl::Status ValidateAdapterName(const std::string& name, const std::string& field);

}  // namespace prl::coordinator
