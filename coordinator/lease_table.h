// LeaseTable: the open leases — which actor holds which prompt, and until when.
//
// A lease is opened when a prompt is leased to an actor and ends with its group completed or
// as a failed attempt (released, expired, dropped from its actor's heartbeat); the table says
// which leases an actor holds, renews them, and finds those past their deadline. Leases are
// not durable: after a restart the table is empty and every prompt that was in flight is
// pending again (coordinator/coordinator.h). What a lease's end does to its prompt (re-queued,
// failed after max_attempts) is the prompt sets' business (coordinator/prompt_sets.h).
//
// Owns: the leases by id, by prompt and by actor, and a bound on the earliest deadline, so that the
// expiry check every Lease call makes scans the table only once a deadline may have passed.
// Not thread-safe: the coordinator calls it under its mutex.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/time/time.h"

namespace prl::coordinator {

// One prompt of one prompt set.
struct PromptRef {
  std::string set_id;
  int64_t index = 0;
  bool operator<(const PromptRef& o) const {
    return set_id != o.set_id ? set_id < o.set_id : index < o.index;
  }
};

class LeaseTable {
 public:
  struct Lease {
    PromptRef prompt;
    std::string actor_id;
    absl::Time deadline;
    absl::Time opened;
    bool reclaim_asked = false;  // its actor was asked to give it back (a fair share)
  };

  explicit LeaseTable(int64_t lease_ms) : lease_ms_(lease_ms) {}

  // Opens a lease of `prompt` (which has none) for the actor, lasting lease_ms from `now`.
  // Returns the new lease's id (coordinator/ids.h: it names its prompt).
  std::string Open(const PromptRef& prompt, const std::string& actor_id, absl::Time now);
  // The lease with this id, or null (never opened, or ended).
  const Lease* Find(const std::string& lease_id) const;
  // The id of the prompt's open lease, or null.
  const std::string* IdOf(const PromptRef& prompt) const;
  // Ends the prompt's lease, if it has one.
  void End(const PromptRef& prompt);
  // Ends the leases of the sets `retired` names (retention).
  void EndSets(const std::function<bool(const std::string& set_id)>& retired);

  // Renews, to lease_ms from `now`, the actor's leases that `held` lists, and returns the
  // prompts of its others (still open: the caller ends them as failed attempts).
  std::vector<PromptRef> Renew(const std::string& actor_id,
                               const absl::flat_hash_set<std::string>& held, absl::Time now);
  // The prompts whose leases are past their deadline at `now` (still open), in lease id order.
  std::vector<PromptRef> Expired(absl::Time now);
  // The actors that hold a lease.
  absl::flat_hash_set<std::string> Holders() const;
  // The actor's leases, by lease id.
  std::vector<std::pair<std::string, const Lease*>> HeldBy(const std::string& actor_id) const;
  // Records that the lease's actor was asked to give it back.
  void MarkReclaimAsked(const std::string& lease_id);
  int64_t size() const { return static_cast<int64_t>(leases_.size()); }

 private:
  void Forget(const std::string& lease_id, const std::string& actor_id);  // from by_actor_

  int64_t lease_ms_;
  std::map<std::string, Lease> leases_;                    // by lease id
  std::map<PromptRef, std::string> by_prompt_;             // prompt -> lease id
  std::map<std::string, std::set<std::string>> by_actor_;  // actor id -> its lease ids
  // At or before every open lease's deadline (renewals only move deadlines later).
  absl::Time earliest_deadline_ = absl::InfiniteFuture();
};

}  // namespace prl::coordinator
