#include "coordinator/actor_table.h"

#include "absl/strings/str_cat.h"
#include "coordinator/ids.h"

namespace prl::coordinator {

absl::StatusOr<std::string> ActorTable::Register(const std::string& name,
                                                 const prl::v1::ActorCapacity& capacity,
                                                 absl::Time now) {
  if (full()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("coordinator: ", size(),
                     " actors are registered and alive, the most it takes "
                     "(coordinator.max_actors ",
                     max_actors_, "); actor '", name.substr(0, 64), "' is refused"));
  }
  const std::string id = absl::StrCat("actor-", RandomHex().substr(0, 10));
  actors_[id] = Actor{name, 0, now, capacity};
  return id;
}

ActorTable::Actor* ActorTable::Find(const std::string& actor_id) {
  auto it = actors_.find(actor_id);
  return it == actors_.end() ? nullptr : &it->second;
}

std::string ActorTable::Describe(const std::string& actor_id) const {
  auto it = actors_.find(actor_id);
  return it == actors_.end() ? actor_id : absl::StrCat(it->second.name, " (", actor_id, ")");
}

void ActorTable::Forget(absl::Time now, const HoldsLease& holds_lease) {
  const absl::Duration silence = 2 * absl::Milliseconds(lease_ms_);
  std::erase_if(actors_, [&](const auto& entry) {
    return entry.second.last_seen + silence < now && !holds_lease(entry.first);
  });
}

std::vector<const prl::v1::ActorCapacity*> ActorTable::LiveCapacities(absl::Time now) const {
  const absl::Time since = now - absl::Milliseconds(lease_ms_);
  std::vector<const prl::v1::ActorCapacity*> live;
  for (const auto& [id, actor] : actors_) {
    if (actor.last_seen >= since) live.push_back(&actor.capacity);
  }
  return live;
}

}  // namespace prl::coordinator
