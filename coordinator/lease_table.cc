#include "coordinator/lease_table.h"

#include <algorithm>

#include "coordinator/ids.h"

namespace prl::coordinator {

std::string LeaseTable::Open(const PromptRef& prompt, const std::string& actor_id, absl::Time now) {
  std::string id = LeaseId(prompt.set_id, prompt.index);
  const absl::Time deadline = now + absl::Milliseconds(lease_ms_);
  earliest_deadline_ = std::min(earliest_deadline_, deadline);
  leases_[id] = Lease{prompt, actor_id, deadline, now, false};
  by_prompt_[prompt] = id;
  by_actor_[actor_id].insert(id);
  return id;
}

const LeaseTable::Lease* LeaseTable::Find(const std::string& lease_id) const {
  auto it = leases_.find(lease_id);
  return it == leases_.end() ? nullptr : &it->second;
}

const std::string* LeaseTable::IdOf(const PromptRef& prompt) const {
  auto it = by_prompt_.find(prompt);
  return it == by_prompt_.end() ? nullptr : &it->second;
}

void LeaseTable::Forget(const std::string& lease_id, const std::string& actor_id) {
  auto holder = by_actor_.find(actor_id);
  if (holder == by_actor_.end()) return;
  holder->second.erase(lease_id);
  if (holder->second.empty()) by_actor_.erase(holder);
}

void LeaseTable::End(const PromptRef& prompt) {
  auto it = by_prompt_.find(prompt);
  if (it == by_prompt_.end()) return;
  auto lease = leases_.find(it->second);
  Forget(it->second, lease->second.actor_id);
  leases_.erase(lease);
  by_prompt_.erase(it);
}

void LeaseTable::EndSets(const std::function<bool(const std::string& set_id)>& retired) {
  for (auto it = leases_.begin(); it != leases_.end();) {
    if (!retired(it->second.prompt.set_id)) {
      ++it;
      continue;
    }
    by_prompt_.erase(it->second.prompt);
    Forget(it->first, it->second.actor_id);
    it = leases_.erase(it);
  }
}

std::vector<PromptRef> LeaseTable::Renew(const std::string& actor_id,
                                         const absl::flat_hash_set<std::string>& held,
                                         absl::Time now) {
  std::vector<PromptRef> dropped;
  const absl::Time deadline = now + absl::Milliseconds(lease_ms_);
  for (auto& [id, lease] : leases_) {
    if (lease.actor_id != actor_id) continue;
    if (held.contains(id)) {
      lease.deadline = deadline;
      earliest_deadline_ = std::min(earliest_deadline_, deadline);
    } else {
      dropped.push_back(lease.prompt);
    }
  }
  return dropped;
}

std::vector<PromptRef> LeaseTable::Expired(absl::Time now) {
  std::vector<PromptRef> expired;
  // Every Lease call comes here: a scan only once the earliest deadline may have passed.
  if (now <= earliest_deadline_) return expired;
  earliest_deadline_ = absl::InfiniteFuture();
  for (const auto& [id, lease] : leases_) {
    if (lease.deadline < now) {
      expired.push_back(lease.prompt);
    } else {
      earliest_deadline_ = std::min(earliest_deadline_, lease.deadline);
    }
  }
  return expired;
}

absl::flat_hash_set<std::string> LeaseTable::Holders() const {
  absl::flat_hash_set<std::string> holders;
  for (const auto& [id, lease] : leases_) holders.insert(lease.actor_id);
  return holders;
}

std::vector<std::pair<std::string, const LeaseTable::Lease*>> LeaseTable::HeldBy(
    const std::string& actor_id) const {
  std::vector<std::pair<std::string, const Lease*>> out;
  auto holder = by_actor_.find(actor_id);
  if (holder == by_actor_.end()) return out;
  for (const std::string& id : holder->second) out.emplace_back(id, &leases_.at(id));
  return out;
}

void LeaseTable::MarkReclaimAsked(const std::string& lease_id) {
  auto it = leases_.find(lease_id);
  if (it != leases_.end()) it->second.reclaim_asked = true;
}

}  // namespace prl::coordinator
