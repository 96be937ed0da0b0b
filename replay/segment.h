// Segment: the bookkeeping of a mapped replay segment (internal to replay/). Every method
// that changes state takes the LockedSection it runs under; none waits or copies payloads.
// Methods that loop stop when the section's undo budget is spent (LockedSection::HasRoom) and
// say so (Step::kYield): the caller ends the section and calls again.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "replay/segment_layout.h"

namespace prl::replay_internal {

int64_t SteadyNowNs();

// What a bookkeeping step did.
enum class Step {
  kDone,   // it did what was asked
  kNone,   // nothing to do now (no space, no group ready): the caller may wait
  kYield,  // made progress, but the section's undo budget is spent: call again in a new one
};

class Segment {
 public:
  explicit Segment(uint8_t* base, uint64_t mapped_bytes = 0)
      : base_(base), h_(reinterpret_cast<Header*>(base)), mapped_bytes_(mapped_bytes) {}

  Header& header() const { return *h_; }
  uint8_t* base() const { return base_; }
  FrameHeader& Frame(uint64_t position) const;
  uint8_t* Payload(uint64_t position) const { return reinterpret_cast<uint8_t*>(&Frame(position)) + sizeof(FrameHeader); }
  A64& QueueEntry(uint64_t index) const;
  LeaseSlot& Lease(uint64_t slot) const;
  WriterSlot& Writer(uint64_t slot) const;
  uint64_t QueueSize() const { return h_->queue_tail.load() - h_->queue_head.load(); }
  uint64_t mapped_bytes() const { return mapped_bytes_; }

  struct Allocation {
    uint64_t position = 0;
    uint64_t writer_slot = 0;
  };
  // The prompt of a group being written (its frame keeps it: a dropped group's prompt is
  // recorded for hand-back). Id words all zero: none to record.
  struct FramePrompt {
    uint64_t index = 0;
    uint64_t set_id[kPromptSetIdWords] = {};
  };
  // Reserves a frame of frame_bytes for this process's write, dropping the oldest ready groups
  // first under kDropOldest. kNone when it must wait (no space, frame or writer slot).
  Step TryAllocate(LockedSection& lock, uint64_t frame_bytes, uint64_t payload_bytes,
                   uint64_t group_key, uint64_t num_records, const FramePrompt& prompt,
                   Allocation* out);
  // The dropped groups' prompts not yet handed back (at most max), oldest first, and the
  // sequence number just past the last one returned.
  std::vector<FramePrompt> DroppedPrompts(size_t max, uint64_t* through) const;
  // Entries before `through` were handed back.
  void ForgetDroppedPrompts(LockedSection& lock, uint64_t through);
  void Commit(LockedSection& lock, const Allocation& allocation, uint64_t checksum,
              int64_t min_version);
  // Gives an allocation back unwritten (the group turned out invalid while being encoded).
  void Abort(LockedSection& lock, const Allocation& allocation);

  // Pops the next ready group for a lease; drops (and counts) stale ones on the way.
  // kNone when nothing is ready or no lease slot is free.
  struct LeaseGrant {
    uint64_t position = 0, slot = 0, generation = 0;
  };
  Step TryLease(LockedSection& lock, int64_t learner_version, int64_t max_lag, LeaseGrant* out);
  // Ack (consumed = true) or Release of a lease held by this process; false if it was lost.
  bool EndLease(LockedSection& lock, uint64_t position, uint64_t slot, uint64_t generation,
                bool consumed);
  // Moves the deadline of a lease held by this process to now + lease_ns; false if it was lost.
  bool RenewLease(LockedSection& lock, uint64_t position, uint64_t slot, uint64_t generation);

  // Expires leases (deadline passed or reader dead) and abandons dead writers' frames, at most
  // every 10 ms unless forced; then reclaims. Returns true if anything changed. What the
  // section's undo budget leaves undone is done by the next call.
  bool Maintain(LockedSection& lock, bool force);
  // Advances the tail over reclaimable frames; returns bytes reclaimed.
  uint64_t ReclaimTail(LockedSection& lock);

 private:
  void PushFront(LockedSection& lock, uint64_t position);
  void PushBack(LockedSection& lock, uint64_t position);
  void DropFront(LockedSection& lock);
  void WriteFrameHeader(LockedSection& lock, uint64_t position, uint64_t frame_bytes,
                        FrameState state);
  // The lease slot `slot` if it still holds (position, generation) for this process.
  LeaseSlot* HeldLease(uint64_t position, uint64_t slot, uint64_t generation) const;

  uint8_t* base_;
  Header* h_;
  uint64_t mapped_bytes_;
};

}  // namespace prl::replay_internal
