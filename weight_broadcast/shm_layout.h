// The shared-memory weight segment's layout (internal to weight_broadcast/; tests read it to
// check and to damage segments).
//
//   [ShmHeader, padded to 4 KiB | slot 0: one version's fp32 buffer | slot 1: the same]
//
// Seqlock protocol (no locks: a dead process cannot hold an atomic):
//   publish v: s = the slot `published` does not name (0 at first);
//              slots[s].sequence = next odd value; release fence;
//              slots[s].version = v; copy the weights into slot s;
//              slots[s].sequence = next even value (release);
//              published = v << 1 | s (release); bump and wake `futex`.
//   read:      w = published (acquire); s = w & 1;
//              q = slots[s].sequence (acquire), retry if odd; v = slots[s].version;
//              copy slot s out; acquire fence; retry unless slots[s].sequence == q.
// The reader's version is the one read inside the sequence window, never w >> 1: a publisher
// that lapped the reader twice may have rewritten the slot `published` named.
// `published` only ever names a slot whose sequence is even, so a publisher killed mid-write
// leaves the previous version readable; its slot stays odd until the next publisher rewrites
// it (its first sequence value is the next odd one either way).
#pragma once

#include <atomic>
#include <cstdint>

namespace prl::weight_broadcast_internal {

using A64 = std::atomic<uint64_t>;

inline constexpr uint64_t kShmMagic = 0x31544847574c5250ull;  // "PRLWGHT1"
inline constexpr uint32_t kShmLayoutVersion = 1;
inline constexpr uint64_t kNothingPublished = ~uint64_t{0};
inline constexpr uint64_t kShmAlign = 4096;

inline uint64_t PackPublished(int64_t version, int slot) {
  return static_cast<uint64_t>(version) << 1 | static_cast<uint64_t>(slot);
}
inline int64_t PublishedVersion(uint64_t word) { return static_cast<int64_t>(word >> 1); }
inline int PublishedSlot(uint64_t word) { return static_cast<int>(word & 1); }

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

struct alignas(64) ShmSlot {
  A64 sequence;  // odd while being written
  A64 version;   // the version the slot holds (meaningful while sequence is even)
};

struct ShmHeader {
  ShmFixedHeader fixed;
  uint64_t fixed_checksum;    // XXH3-64 of `fixed`
  A64 initialized;            // kShmMagic once the creator finished; set last
  alignas(64) A64 published;  // PackPublished(version, slot) or kNothingPublished
  alignas(64) A64 publisher;  // ProcessToken of the attached publisher; 0: none
  ShmSlot slots[2];
  alignas(64) std::atomic<uint32_t> futex;  // bumped after every publish
};
static_assert(sizeof(ShmHeader) <= kShmAlign);

}  // namespace prl::weight_broadcast_internal
