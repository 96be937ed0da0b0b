// The shared-memory weight segment's layout (internal to weight_broadcast/; tests read it to
// check and to damage segments).
//
//   [ShmHeader, padded to 4 KiB | slot 0: one version's fp32 buffer | slot 1: the same]
//
// Slots are written and read with the two-slot seqlock of weight_broadcast/seqlock.h (no locks:
// a dead process cannot hold an atomic); a slot's payload is one version's fp32 buffer. A
// publisher killed mid-write leaves the previous version readable.
#pragma once

#include <atomic>
#include <cstdint>

#include "weight_broadcast/seqlock.h"

namespace prl::weight_broadcast_internal {

inline constexpr uint64_t kShmMagic = 0x31544847574c5250ull;  // "PRLWGHT1"
inline constexpr uint32_t kShmLayoutVersion = 1;
inline constexpr uint64_t kShmAlign = 4096;

// Written once by the creator; covered by fixed_checksum.
struct ShmFixedHeader {
  uint64_t magic;
  uint32_t layout_version;
  uint32_t reserved;
  uint64_t segment_bytes;
  uint64_t weight_bytes;    // one version: the ParameterSet buffer (num_elements * 4)
  uint64_t slot_offset[2];  // kShmAlign-aligned
  int64_t created_unix_ns;
  char fingerprint[1024];  // ModelFingerprint of the model, NUL-terminated
};

struct ShmHeader {
  ShmFixedHeader fixed;
  uint64_t fixed_checksum;    // XXH3-64 of `fixed`
  A64 initialized;            // kShmMagic once the creator finished; set last
  alignas(64) A64 published;  // PackPublished(version, slot) or kNothingPublished
  alignas(64) A64 publisher;  // ProcessToken of the attached publisher; 0: none
  SeqlockSlot slots[2];
  alignas(64) std::atomic<uint32_t> futex;  // bumped after every publish
};
static_assert(sizeof(ShmHeader) <= kShmAlign);

}  // namespace prl::weight_broadcast_internal
