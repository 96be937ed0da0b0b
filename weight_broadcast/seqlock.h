// The two-slot seqlock of the shared-memory weight segments (shm and cuda_ipc; internal to
// weight_broadcast/). One writer (the segment's publisher) and any number of readers in other
// processes, no locks: a dead process cannot hold an atomic.
//
//   write v: s = SlotToWrite(published) (the slot `published` does not name; 0 at first);
//            q = BeginSlotWrite(slot s, v)  (sequence odd; version v)
//            write the slot's payload, completely (device copies synchronised);
//            EndSlotWrite(slot s, q, published, v, s)  (sequence even; published names s).
//   read:    r = BeginSlotRead(published, slot 0, slot 1) (nullopt: nothing, or mid-write);
//            copy the payload of slot r->slot out, completely (device copies synchronised);
//            SlotReadValid(slot r->slot, *r): false if the writer touched the slot meanwhile
//            (then the copy may be torn: discard it and read again).
// The reader's version is the one read inside the sequence window, never the one packed in
// `published`: a writer that lapped the reader twice may have rewritten the slot it named.
// `published` only ever names a slot whose sequence is even, so a writer killed mid-write
// leaves the previous version readable; its slot stays odd until the next writer rewrites it
// (BeginSlotWrite moves an odd sequence to the next odd value).
#pragma once

#include <atomic>
#include <cstdint>
#include <optional>

namespace prl::weight_broadcast_internal {

using A64 = std::atomic<uint64_t>;

inline constexpr uint64_t kNothingPublished = ~uint64_t{0};

inline uint64_t PackPublished(int64_t version, int slot) {
  return static_cast<uint64_t>(version) << 1 | static_cast<uint64_t>(slot);
}
inline int64_t PublishedVersion(uint64_t word) { return static_cast<int64_t>(word >> 1); }
inline int PublishedSlot(uint64_t word) { return static_cast<int>(word & 1); }

struct alignas(64) SeqlockSlot {
  A64 sequence;  // odd while being written
  A64 version;   // the version the slot holds (meaningful while sequence is even)
};

// The slot a writer fills next: the one `published_word` does not name.
inline int SlotToWrite(uint64_t published_word) {
  return published_word == kNothingPublished ? 0 : 1 - PublishedSlot(published_word);
}

// Marks `slot` as being written with `version`; returns the odd sequence value for
// EndSlotWrite. The sequential-consistency fence orders the odd mark before every later write
// of the payload, including a DMA that the writer starts afterwards.
inline uint64_t BeginSlotWrite(SeqlockSlot& slot, int64_t version) {
  const uint64_t seq = slot.sequence.load(std::memory_order_relaxed);
  const uint64_t writing = (seq & 1) != 0 ? seq + 2 : seq + 1;
  slot.sequence.store(writing, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  slot.version.store(static_cast<uint64_t>(version), std::memory_order_relaxed);
  return writing;
}

// Marks the slot complete and names it in `published`. The payload must be completely written.
inline void EndSlotWrite(SeqlockSlot& slot, uint64_t writing, A64& published, int64_t version,
                         int slot_index) {
  slot.sequence.store(writing + 1, std::memory_order_release);
  published.store(PackPublished(version, slot_index), std::memory_order_release);
}

struct SlotRead {
  int slot = 0;
  uint64_t sequence = 0;
  int64_t version = -1;
};

// Starts reading the newest of `slot0` and `slot1`: nullopt if nothing is published or that
// slot is being rewritten (read again later).
inline std::optional<SlotRead> BeginSlotRead(const A64& published, const SeqlockSlot& slot0,
                                             const SeqlockSlot& slot1) {
  const uint64_t word = published.load(std::memory_order_acquire);
  if (word == kNothingPublished) return std::nullopt;
  SlotRead r;
  r.slot = PublishedSlot(word);
  const SeqlockSlot& slot = r.slot == 0 ? slot0 : slot1;
  r.sequence = slot.sequence.load(std::memory_order_acquire);
  if ((r.sequence & 1) != 0) return std::nullopt;
  r.version = static_cast<int64_t>(slot.version.load(std::memory_order_relaxed));
  return r;
}

// After the payload was copied out completely: true if the copy is the version r.version.
inline bool SlotReadValid(const SeqlockSlot& slot, const SlotRead& r) {
  std::atomic_thread_fence(std::memory_order_acquire);
  return slot.sequence.load(std::memory_order_relaxed) == r.sequence;
}

}  // namespace prl::weight_broadcast_internal
