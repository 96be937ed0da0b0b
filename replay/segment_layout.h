// The replay segment's memory layout (internal to replay/). Every field that changes after
// creation is a std::atomic<uint64_t> written only under the LeaseLock, through its undo log.
//
//   [Header | ready queue | lease slots | writer slots | data ring]
//
// The data ring holds frames at 128-byte aligned, monotonically increasing positions (ring
// offset = position % data_bytes): a 128-byte FrameHeader, then the encoded group. A frame
// never wraps: the space left before the ring's end is covered by a padding frame. Frames
// between tail and head are live or reclaimable; the tail advances over reclaimable ones.
//
// Frame states: kWriting (owned by a writer) -> kCommitted (in the ready queue) -> kLeased
// (held by a reader) -> kConsumed; kLeased -> kCommitted again when the lease expires or its
// reader dies; kCommitted -> kDropped (stale, or dropped for room); kWriting -> kAbandoned
// when the writer dies. kConsumed, kDropped, kAbandoned and kPadding are reclaimable.
#pragma once

#include <atomic>
#include <cstdint>

#include "replay/lease_lock.h"

namespace prl::replay_internal {

using A64 = std::atomic<uint64_t>;

inline constexpr uint64_t kMagic = 0x3159414c50455250ull;  // "PREPLAY1"
// 2: the prompts of dropped groups; 3: records of layout 3 (agents' segments).
inline constexpr uint32_t kLayoutVersion = 3;
inline constexpr uint64_t kFrameAlign = 128;

enum FrameState : uint64_t {
  kWriting = 1,
  kCommitted = 2,
  kLeased = 3,
  kConsumed = 4,
  kDropped = 5,
  kAbandoned = 6,
  kPadding = 7,
};

// A prompt set id travels in this many words (ids up to 24 bytes: the coordinator's are 15).
inline constexpr int kPromptSetIdWords = 3;

struct FrameHeader {
  A64 position;       // this frame's ring position (checks that a header is current)
  A64 frame_bytes;    // header + payload, a multiple of kFrameAlign
  A64 state;          // FrameState
  A64 owner;          // the writer's ProcessToken while kWriting
  A64 payload_bytes;
  A64 checksum;       // XXH3-64 of the payload, set at commit
  A64 group_key;
  A64 min_version;    // int64 bits
  A64 num_records;
  A64 lease_slot;     // while kLeased
  A64 writer_slot;    // while kWriting
  A64 committed_ns;   // steady clock
  A64 prompt_index;   // of the group's records, so that a dropped group's prompt is known
  A64 prompt_set_id[kPromptSetIdWords];  // its bytes, zero-padded; all zero: unknown or longer
};
static_assert(sizeof(FrameHeader) == kFrameAlign);

struct LeaseSlot {
  A64 active;
  A64 frame_position;
  A64 holder;       // ProcessToken
  A64 deadline_ns;  // steady clock
  A64 generation;   // bumped at every lease, so a stale LeasedGroup cannot ack a new lease
  A64 reserved[3];
};
static_assert(sizeof(LeaseSlot) == 64);

struct WriterSlot {
  A64 active;
  A64 frame_position;
  A64 owner;  // ProcessToken
  A64 reserved[5];
};
static_assert(sizeof(WriterSlot) == 64);

// Written once by the creator; covered by fixed_checksum.
struct FixedHeader {
  uint64_t magic;
  uint32_t layout_version;
  uint32_t backpressure;
  uint64_t segment_bytes;
  uint64_t queue_offset, queue_capacity;
  uint64_t lease_offset, max_leases;
  uint64_t writer_offset, max_writers;
  uint64_t data_offset, data_bytes;
  int64_t lease_ns;
  uint64_t creator_token;
  int64_t created_unix_ns;
  char label[128];
};

struct Counters {
  A64 groups_in, records_in, bytes_in;
  A64 groups_out, records_out, bytes_out;
  A64 dropped_stale, dropped_full, redelivered, abandoned_writes;
  A64 writer_waits, write_timeouts, reader_waits;
};

// The prompts of groups dropped for room (kDropOldest), so that they are generated again
// rather than lost: entries [handed, next) wait for a reader that hands them back to the
// coordinator (ReplayBuffer::DroppedPrompts); entry i is at i % kDroppedCapacity. A drop into
// a full ring overwrites the oldest entry and counts it in `overwritten`.
inline constexpr uint64_t kDroppedCapacity = 1024;
struct DroppedPromptEntry {
  A64 prompt_index;
  A64 prompt_set_id[kPromptSetIdWords];
};
static_assert(sizeof(DroppedPromptEntry) == 32);
struct DroppedRing {
  A64 next, handed, overwritten;
  A64 reserved[5];
  DroppedPromptEntry entries[kDroppedCapacity];
};

struct Header {
  FixedHeader fixed;
  uint64_t fixed_checksum;      // XXH3-64 of `fixed`
  A64 initialized;              // kMagic once the creator finished; set last
  alignas(64) A64 head;         // ring position where the next frame goes
  A64 tail;                     // oldest frame not yet reclaimed
  A64 queue_head, queue_tail;   // ready queue indices (monotonic; entry i at i % capacity)
  A64 live_frames;              // writing + committed + leased frames
  A64 leased;                   // active lease slots
  A64 writing;                  // active writer slots
  A64 last_maintenance_ns;
  A64 lease_hint, writer_hint;  // where the next free-slot scan starts
  alignas(64) Counters counters;
  alignas(64) DroppedRing dropped;
  alignas(64) std::atomic<uint32_t> data_futex;   // bumped when groups become ready
  alignas(64) std::atomic<uint32_t> space_futex;  // bumped when space or slots free up
  alignas(64) LockState lock;
};

}  // namespace prl::replay_internal
