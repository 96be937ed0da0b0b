// PendingQueue: the coordinator's pending prompts in lease order. Re-runs come first, oldest
// first (a lease that expired, was released or handed back is re-run soon); then every prompt
// set's prompts in index order, set after set in submission order.
//
// A set's prompts are held apart from the others', so that a lease passes over a whole set
// its actor cannot run (samples_per_prompt or the shortest prompt's tokens beyond its
// capacity) in one step instead of prompt by prompt: with a large set that no actor can run
// at the head of the queue, a lease costs the same as without it.
//
// Entries may be stale (the prompt was leased through a duplicate entry, completed or failed
// meanwhile, or its set finished): the scan's visitor says so and they are dropped.
//
// Not thread-safe: the coordinator calls it under its mutex.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <string>
#include <type_traits>
#include <utility>

namespace prl::coordinator {

class PendingQueue {
 public:
  // What a scan does with a set: look at its prompts, pass over all of them (kept), or drop
  // them all (the set is finished: every entry is stale).
  enum class SetVisit { kLook, kPass, kDrop };
  // What a scan does with one prompt: take it (removed), keep it and go on, drop it (stale),
  // or stop the scan (the entry is kept).
  enum class Visit { kTake, kKeep, kDrop, kStop };

  // Appends prompts 0..prompts-1 of a newly submitted set (also when the log is replayed).
  void AddSet(const std::string& set_id, int64_t prompts);
  // Queues a prompt to run again, behind earlier re-runs and ahead of every set's prompts.
  void AddRerun(const std::string& set_id, int64_t index);
  // Forgets every entry of the sets `retired` says yes to.
  void RemoveSets(const std::function<bool(const std::string&)>& retired);
  // Whether no entry is queued (stale ones count: they are dropped only by a scan).
  bool empty() const { return reruns_.empty() && sets_.empty(); }

  // Visits entries in lease order: every re-run through visit(set_id, index); then, set by set,
  // visit_set(set_id), and the set's prompts through visit unless it said kPass or kDrop.
  template <typename SetVisitor, typename Visitor>
  void Scan(SetVisitor&& visit_set, Visitor&& visit);

 private:
  // Visits `entries` (of one set when `set_id` is given) until kStop; false when stopped.
  template <typename Entries, typename Visitor>
  static bool VisitAll(Entries& entries, const std::string* set_id, Visitor& visit);

  std::deque<std::pair<std::string, int64_t>> reruns_;           // (set id, prompt index)
  std::list<std::pair<std::string, std::deque<int64_t>>> sets_;  // non-empty, in submission order
};

template <typename Entries, typename Visitor>
bool PendingQueue::VisitAll(Entries& entries, const std::string* set_id, Visitor& visit) {
  for (auto it = entries.begin(); it != entries.end();) {
    Visit v;
    if constexpr (std::is_same_v<typename Entries::value_type, int64_t>) {
      v = visit(*set_id, *it);
    } else {
      v = visit(it->first, it->second);
    }
    switch (v) {
      case Visit::kTake:
      case Visit::kDrop:
        it = entries.erase(it);
        break;
      case Visit::kKeep:
        ++it;
        break;
      case Visit::kStop:
        return false;
    }
  }
  return true;
}

template <typename SetVisitor, typename Visitor>
void PendingQueue::Scan(SetVisitor&& visit_set, Visitor&& visit) {
  if (!VisitAll(reruns_, nullptr, visit)) return;
  for (auto set = sets_.begin(); set != sets_.end();) {
    const SetVisit what = visit_set(set->first);
    bool go_on = true;
    if (what == SetVisit::kDrop) {
      set->second.clear();
    } else if (what == SetVisit::kLook) {
      go_on = VisitAll(set->second, &set->first, visit);
    }
    set = set->second.empty() ? sets_.erase(set) : std::next(set);
    if (!go_on) return;
  }
}

}  // namespace prl::coordinator
