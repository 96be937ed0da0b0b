#include "coordinator/lease_scheduler.h"

#include <cassert>
#include <map>

namespace prl::coordinator {

void LeaseScheduler::AddSet(const std::string& set_id, int64_t prompts, double weight,
                            const std::string& party) {
  assert(weight > 0);
  SetQueue& q = sets_[set_id];
  q.id = set_id;
  q.order = next_order_++;
  q.weight = weight;
  q.party = party_index_.try_emplace(party, static_cast<int64_t>(party_index_.size())).first->second;
  for (int64_t i = 0; i < prompts; ++i) q.entries.push_back(i);
  if (!q.entries.empty()) queued_[q.order] = &q;
}

void LeaseScheduler::AddRerun(const std::string& set_id, int64_t index) {
  auto it = sets_.find(set_id);
  if (it == sets_.end()) return;
  SetQueue& q = it->second;
  q.entries.insert(q.entries.begin() + q.reruns, index);
  ++q.reruns;
  queued_[q.order] = &q;
}

void LeaseScheduler::RemoveSets(const std::function<bool(const std::string&)>& retired) {
  for (auto it = sets_.begin(); it != sets_.end();) {
    if (!retired(it->first)) {
      ++it;
      continue;
    }
    queued_.erase(it->second.order);
    it = sets_.erase(it);
  }
}

LeaseScheduler::Round LeaseScheduler::StartRound(SetChecker set_check, PromptChecker prompt_check) {
  ++round_;
  return Round(this, set_check, prompt_check);
}

void LeaseScheduler::Erase(SetQueue& q, int64_t at) {
  q.entries.erase(q.entries.begin() + at);
  if (at < q.reruns) --q.reruns;
}

bool LeaseScheduler::FindRunnable(SetQueue& q, PromptChecker prompt_check) {
  while (q.kept < static_cast<int64_t>(q.entries.size())) {
    switch (prompt_check(q.id, q.entries[q.kept])) {
      case PromptCheck::kRuns:
        return true;
      case PromptCheck::kKeep:
        ++q.kept;
        break;
      case PromptCheck::kDrop:
        Erase(q, q.kept);
        break;
    }
  }
  return false;
}

std::optional<PromptRef> LeaseScheduler::Round::Next() {
  LeaseScheduler& s = *s_;
  s.open_.clear();
  SetQueue* best = nullptr;
  for (auto it = s.queued_.begin(); it != s.queued_.end();) {
    SetQueue& q = *it->second;
    if (q.round != s.round_) {
      q.round = s.round_;
      q.kept = 0;
      q.passed = false;
    }
    SetCheck check = q.passed ? SetCheck::kPass : set_check_(q.id);
    if (check == SetCheck::kOpen && !FindRunnable(q, prompt_check_)) check = SetCheck::kPass;
    if (check == SetCheck::kDrop) {
      q.entries.clear();
      q.reruns = 0;
    }
    if (q.entries.empty()) {
      it = s.queued_.erase(it);
      continue;
    }
    ++it;
    if (check == SetCheck::kPass) q.passed = true;
    if (check != SetCheck::kOpen) continue;
    s.open_.push_back(&q);
  }
  if (s.open_.empty()) return std::nullopt;
  // Each open party's sets share its equal part by weight; one party alone: the weights as
  // they are (so that a run of one model's choices are exactly the weighted round robin's).
  // (Indexed scratch: a lease's choices allocate nothing.)
  s.party_weight_.assign(s.party_index_.size(), 0.0);
  int64_t parties = 0;
  for (const SetQueue* q : s.open_) {
    if (s.party_weight_[q->party] == 0.0) ++parties;
    s.party_weight_[q->party] += q->weight;
  }
  for (SetQueue* q : s.open_) {
    q->share = parties == 1 ? q->weight : q->weight / s.party_weight_[q->party];
    if (best == nullptr || q->credit + q->share > best->credit + best->share) best = q;
  }
  double total = 0;
  for (SetQueue* q : s.open_) {
    q->credit += q->share;
    total += q->share;
  }
  best->credit -= total;
  PromptRef out{best->id, best->entries[best->kept]};
  Erase(*best, best->kept);
  if (best->entries.empty()) s.queued_.erase(best->order);
  return out;
}

}  // namespace prl::coordinator
