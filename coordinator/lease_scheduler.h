// LeaseScheduler: which pending prompt is leased next.
//
// Owns the pending prompts in lease order and each prompt set's weight and round-robin credit.
// Within a set, re-runs come first, oldest first (a lease that expired, was released or handed
// back runs again soon), then its prompts in index order. Between sets, smooth weighted round
// robin (nginx's): for each prompt leased, every set open to the actor (it has a prompt the
// actor can run, and may take one more) adds its weight to its credit; the set of the highest
// credit (the earliest submitted on a tie) gives its next prompt and pays back the sum of the
// open sets' weights. So among sets open together, after n leases a set has n * weight / sum
// of weights leases less its credit / sum, which stays bounded (about a lease): the sets are
// leased in proportion, interleaved (weights 1 and 3: B A B B, B A B B, ...). A set that is not
// open (nothing pending, its actor cannot run it, its class at its fair share) neither earns
// nor pays, and the others keep their proportion between them.
//
// Tenants (a run of adapters): each set belongs to a party (its tenant, or its adapter when no
// tenant is named; "" for every set of a run of one model), and the parties open together share
// the leases equally before their sets share a party's part by weight: a set's weight in a
// choice is its weight over the sum of its party's open sets' weights. So a tenant that submits
// ten sets takes no more than another tenant with one set; with one party open the sets share
// by weight as above.
//
// A set's entries are held apart from the others', so that a lease passes over a whole set its
// actor cannot run in one step instead of prompt by prompt: with a large set no actor can run,
// a lease costs the same as without it. Entries may be stale (the prompt was leased through a
// duplicate entry, completed or failed meanwhile, or its set finished): the round's checks say
// so and they are dropped.
//
// A lease call is one Round: its checks say, before each choice, which sets are open and which
// prompts the actor can run; a prompt it cannot run keeps its place and is not looked at again
// in that round.
//
// Not thread-safe: the coordinator calls it under its mutex.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "coordinator/lease_table.h"

namespace prl::coordinator {

class LeaseScheduler {
 public:
  // What a round asks of a set before each choice: open (it may give its next prompt), waiting
  // (not for this choice: its class holds its fair share), passed (not in this round: the
  // actor cannot run it), dropped (finished: every entry is stale).
  enum class SetCheck { kOpen, kWait, kPass, kDrop };
  // What a round asks of a set's next prompt: the actor can run it, keep it (for another actor),
  // or drop it (stale: no longer pending).
  enum class PromptCheck { kRuns, kKeep, kDrop };
  using SetChecker = absl::FunctionRef<SetCheck(const std::string& set_id)>;
  using PromptChecker = absl::FunctionRef<PromptCheck(const std::string& set_id, int64_t index)>;

  // A newly submitted set (also when the log is replayed): prompts 0..prompts-1 are pending.
  // Requires weight > 0. `party`: its tenant or adapter (above); "" for a run of one model.
  void AddSet(const std::string& set_id, int64_t prompts, double weight,
              const std::string& party = "");
  // Queues a prompt of a set added before to run again, behind the set's earlier re-runs and
  // ahead of its other prompts; an unknown set is ignored.
  void AddRerun(const std::string& set_id, int64_t index);
  // Forgets every set `retired` says yes to, with its entries.
  void RemoveSets(const std::function<bool(const std::string&)>& retired);
  // Whether no entry is queued (stale ones count: they are dropped only by a round).
  bool empty() const { return queued_.empty(); }

  class Round {
   public:
    // The next prompt to lease, taken from the queue (the caller leases it), or none when no
    // set is open with a prompt the actor can run.
    std::optional<PromptRef> Next();

   private:
    friend class LeaseScheduler;
    Round(LeaseScheduler* scheduler, SetChecker set_check, PromptChecker prompt_check)
        : s_(scheduler), set_check_(set_check), prompt_check_(prompt_check) {}
    LeaseScheduler* s_;
    SetChecker set_check_;
    PromptChecker prompt_check_;
  };
  // One lease call's choices. The checks must outlive the round; nothing else may change the
  // scheduler while it is used.
  Round StartRound(SetChecker set_check, PromptChecker prompt_check);

 private:
  struct SetQueue {
    std::string id;
    uint64_t order = 0;  // submission order: ties go to the earlier set
    double weight = 1;
    int64_t party = 0;            // its tenant or adapter, by index (party_index_)
    double share = 1;             // scratch: its weight in one choice (weight / party's open sum)
    double credit = 0;            // the round robin's "current weight"
    std::deque<int64_t> entries;  // prompt indexes: re-runs first (the first `reruns`)
    int64_t reruns = 0;
    // The current round's view of the set (reset when round != round_): entries before `kept`
    // are kept for other actors, and `passed` sets are not looked at again.
    uint64_t round = 0;
    int64_t kept = 0;
    bool passed = false;
  };
  // Whether the set has an entry the round's actor can run, at entries[kept] (stale entries on
  // the way are dropped).
  static bool FindRunnable(SetQueue& q, PromptChecker prompt_check);
  static void Erase(SetQueue& q, int64_t at);

  std::map<std::string, SetQueue> sets_;  // every set added and not removed
  std::map<uint64_t, SetQueue*> queued_;  // the sets with entries, in submission order
  uint64_t next_order_ = 0;
  uint64_t round_ = 0;
  std::vector<SetQueue*> open_;  // scratch: the open sets of one choice
  std::map<std::string, int64_t> party_index_;  // parties by name ("" for a run of one model)
  std::vector<double> party_weight_;           // scratch: each party's open weight in a choice
};

}  // namespace prl::coordinator
