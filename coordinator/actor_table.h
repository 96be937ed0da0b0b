// ActorTable: the actors registered with the coordinator, bounded (coordinator.max_actors):
// their names, capacities (coordinator/capacity.h), weight versions and when each was last
// heard from. An actor silent for 2 lease_ms that holds no lease is forgotten (Forget, and a
// registration at the cap); one that comes back is told to register again (NOT_FOUND from the
// coordinator). Not thread-safe: the coordinator calls it under its mutex.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "prl/v1/prompt.pb.h"

namespace prl::coordinator {

class ActorTable {
 public:
  struct Actor {
    std::string name;
    int64_t weight_version = 0;
    absl::Time last_seen;
    prl::v1::ActorCapacity capacity;
  };
  // Whether the actor with this id holds a lease now (such an actor is never forgotten).
  using HoldsLease = std::function<bool(const std::string& actor_id)>;

  ActorTable(int64_t max_actors, int64_t lease_ms) : max_actors_(max_actors), lease_ms_(lease_ms) {}

  // A new actor's id, heard from at `now`; RESOURCE_EXHAUSTED naming the cap when the table
  // is full (the caller forgets silent actors first: it knows who holds leases).
  absl::StatusOr<std::string> Register(const std::string& name,
                                       const prl::v1::ActorCapacity& capacity, absl::Time now);
  // The actor, or null when it is unknown (never registered, or forgotten).
  Actor* Find(const std::string& actor_id);
  // "name (id)" for log lines and reasons; the id alone when unknown.
  std::string Describe(const std::string& actor_id) const;
  // Forgets actors silent for 2 lease_ms at `now` that hold no lease.
  void Forget(absl::Time now, const HoldsLease& holds_lease);
  // The capacities of actors heard from within the last lease_ms (pointers into the table).
  std::vector<const prl::v1::ActorCapacity*> LiveCapacities(absl::Time now) const;
  int64_t size() const { return static_cast<int64_t>(actors_.size()); }
  bool full() const { return size() >= max_actors_; }

 private:
  int64_t max_actors_, lease_ms_;
  std::map<std::string, Actor> actors_;  // by id
};

}  // namespace prl::coordinator
