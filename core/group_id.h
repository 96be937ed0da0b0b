// A group's id: every record of the group an actor generates for a leased prompt carries
// XXH3-64 of the lease id, which only the coordinator and the lease holder know. The replay
// ingest asks the coordinator whether a pushed group's id is that of an open lease
// (ActorControl.CheckGroup).
#pragma once

#include <cstdint>

#include "absl/strings/string_view.h"
#include "core/xxhash_inline.h"

namespace prl {

inline uint64_t GroupIdOfLease(absl::string_view lease_id) {
  return XXH3_64bits(lease_id.data(), lease_id.size());
}

}  // namespace prl
