#include "coordinator/adapters.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "coordinator/field_error.h"
#include "core/adapter_names.h"

namespace prl::coordinator {

namespace {


}  // namespace

absl::Status ValidateAdapterName(const std::string& name, const std::string& field) {
  if (IsAdapterName(name)) return absl::OkStatus();
  return Invalid(field,
                 absl::StrCat("1 to ", kMaxAdapterName,
                              " characters of [a-z0-9._-] starting with a letter or digit"),
                 absl::StrCat("'", name.substr(0, kMaxAdapterName + 1), "'"));
}

void Adapters::ApplyCreated(const prl::v1::AdapterStatus& created) {
  const std::string& id = created.adapter_id();
  if (by_id_.count(id) > 0 || id_by_name_.count(created.spec().name()) > 0) return;
  Adapter& a = by_id_[id];
  a.status = created;
  id_by_name_[created.spec().name()] = id;
  order_.push_back(id);
  if (settings_.has_value()) {
    a.budget.emplace(settings_->max_lag, settings_->groups_per_step, settings_->sync, 0,
                     start_unix_ns_);
  }
}

void Adapters::ApplyDeleted(const std::string& adapter_id) {
  auto it = by_id_.find(adapter_id);
  if (it == by_id_.end()) return;
  id_by_name_.erase(it->second.status.spec().name());
  by_id_.erase(it);
  order_.erase(std::remove(order_.begin(), order_.end(), adapter_id), order_.end());
}

void Adapters::AddSet(const std::string& adapter_id, const std::string& set_id) {
  if (Adapter* a = MutableById(adapter_id)) a->sets.insert(set_id);
}

void Adapters::RemoveSets(const std::function<bool(const std::string&)>& is_removed) {
  for (auto& [id, a] : by_id_) {
    for (auto it = a.sets.begin(); it != a.sets.end();) {
      it = is_removed(*it) ? a.sets.erase(it) : std::next(it);
    }
  }
}

void Adapters::Completed(const std::string& adapter_id) {
  if (Adapter* a = MutableById(adapter_id)) ++a->completions;
}

void Adapters::HandedBack(const std::string& adapter_id) {
  Adapter* a = MutableById(adapter_id);
  if (a != nullptr && a->budget.has_value()) a->budget->ForgetCompletion(a->completions);
}

void Adapters::Start(const BudgetSettings& settings, uint64_t start_unix_ns) {
  settings_ = settings;
  start_unix_ns_ = start_unix_ns;
  for (auto& [id, a] : by_id_) {
    a.budget.emplace(settings.max_lag, settings.groups_per_step, settings.sync, a.completions,
                     start_unix_ns);
  }
}

const Adapters::Adapter* Adapters::ByName(const std::string& name) const {
  auto it = id_by_name_.find(name);
  return it == id_by_name_.end() ? nullptr : ById(it->second);
}

const Adapters::Adapter* Adapters::ById(const std::string& adapter_id) const {
  auto it = by_id_.find(adapter_id);
  return it == by_id_.end() ? nullptr : &it->second;
}

Adapters::Adapter* Adapters::MutableById(const std::string& adapter_id) {
  auto it = by_id_.find(adapter_id);
  return it == by_id_.end() ? nullptr : &it->second;
}

int64_t Adapters::CreatedBy(const std::string& tenant) const {
  int64_t n = 0;
  for (const auto& [id, a] : by_id_) n += a.status.tenant() == tenant ? 1 : 0;
  return n;
}

std::vector<prl::v1::LogRecord> Adapters::Snapshot() const {
  std::vector<prl::v1::LogRecord> out;
  for (const std::string& id : order_) {
    prl::v1::AdapterStatus* created = out.emplace_back().mutable_adapter_created();
    const prl::v1::AdapterStatus& status = by_id_.at(id).status;
    created->set_adapter_id(status.adapter_id());
    *created->mutable_spec() = status.spec();
    created->set_tenant(status.tenant());
    created->set_created_unix_ms(status.created_unix_ms());
    out.back().set_unix_ms(status.created_unix_ms());
  }
  return out;
}

}  // namespace prl::coordinator
