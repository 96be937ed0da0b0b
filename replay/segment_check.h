// The checks a process runs on a replay segment it attaches to (internal to replay/): nothing
// in shared memory is trusted before it is range-checked, so that a damaged or foreign segment
// is an error naming the field, never an out-of-bounds access or an abort later.
//
//   CheckFixedHeader: the creator's layout (offsets, capacities, sizes, policy, lease time)
//                     is consistent and fits the mapping. Runs on every attach, read-only too.
//   CheckUndoLog:     (replay/lease_lock.h) the lock's undo entries address fields inside the
//                     mapping, before a takeover would roll them back.
//   CheckState:       under the lock: ring positions, the ready queue, lease and writer slots
//                     and every frame header from tail to head agree with each other.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "replay/segment.h"

namespace prl::replay_internal {

// DataLoss naming the segment, the field, what was expected and found (and the remedy).
absl::Status CheckFixedHeader(const FixedHeader& f, uint64_t mapped_bytes, const std::string& name);
// Requires the segment's LockedSection to be held.
absl::Status CheckState(const Segment& segment, const std::string& name);

}  // namespace prl::replay_internal
