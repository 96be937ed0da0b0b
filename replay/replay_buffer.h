// ReplayBuffer: the shared-memory rollout buffer between actors (writers) and learner ranks
// (readers), a named Boost.Interprocess segment on the learner's node.
//
// Unit: a group (all n samples of one prompt, replay/rollout_record.h) is written atomically —
// all of its records or none — and delivered whole, so a reader only ever sees complete
// groups; a group of one is a single record.
//
// Delivery semantics: at least once. A group whose WriteGroup returned OK is handed to readers
// oldest first until one acknowledges it. A reader that dies, or does not Ack within the lease
// (lease_ms), loses the group, which is delivered again; so a group can be processed twice,
// never zero times, and never after its Ack. Groups too stale for the reader's learner version
// (lag > max_lag) are dropped and counted, never delivered. A writer that dies mid-write leaves
// nothing visible: its space is reclaimed. Bytes delivered are checksummed (XXH3); a reader
// never sees a torn group.
//
// Crash tolerance: all bookkeeping happens under a LeaseLock (replay/lease_lock.h), which a
// dead holder cannot keep and whose half-done work is rolled back; payloads are copied outside
// it, into space owned by the writer or leased by the reader. Waits use futexes with timeouts.
//
// Thread-safety: a ReplayBuffer may be used from several threads of one process and from many
// processes at once; so may several ReplayBuffers of one segment in one process.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "core/service_defaults.h"
#include "replay/rollout_record.h"

namespace prl {

namespace replay_internal {
struct Mapping;
}

enum class BackpressurePolicy : uint32_t {
  kBlock = 0,       // writers wait (up to their timeout) for space: keeps training on-policy
  kDropOldest = 1,  // the oldest undelivered groups are dropped (counted) to make room
};

struct ReplayConfig {
  int64_t capacity_bytes = defaults::kReplayCapacityMb << 20;  // ring of group frames
  int64_t max_groups = 0;  // groups in the buffer at once; 0: capacity_bytes / 4096
  BackpressurePolicy backpressure = BackpressurePolicy::kBlock;
  int64_t lease_ms = defaults::kReplayLeaseMs;  // a taken group not acked is delivered again
  int32_t max_leases = 4096;   // groups taken and not yet acked, all readers together
  int32_t max_writers = 1024;  // writes in progress at once, all writers together
  std::string label;           // free text recorded in the header (e.g. the run id)
};

struct ReplayStats {
  int64_t capacity_bytes = 0;
  int64_t used_bytes = 0;    // ring bytes from the oldest live frame to the newest
  int64_t groups_ready = 0;  // committed, waiting for a reader
  int64_t groups_leased = 0;
  int64_t writes_in_progress = 0;
  int64_t groups_in = 0, records_in = 0, bytes_in = 0;
  int64_t groups_out = 0, records_out = 0, bytes_out = 0;  // acknowledged
  int64_t dropped_stale = 0;                               // groups older than a reader's max_lag
  int64_t dropped_full = 0;      // groups dropped by the drop-oldest policy
  int64_t redelivered = 0;       // leases that expired or whose reader died
  int64_t abandoned_writes = 0;  // writers that died mid-write
  int64_t writer_waits = 0;      // times a writer waited for space
  int64_t write_timeouts = 0;
  int64_t reader_waits = 0;
  int64_t lock_takeovers = 0;  // locks taken over from dead holders
  // Dropped groups' prompts waiting to be handed back (DroppedPrompts), and those overwritten
  // in the full ring before a reader took them (their prompts stay done untrained: visible).
  int64_t dropped_prompts_waiting = 0, dropped_prompts_overwritten = 0;
};

// The prompt of a group the drop-oldest policy dropped (ReplayBuffer::DroppedPrompts).
struct DroppedPrompt {
  std::string prompt_set_id;
  uint64_t prompt_index = 0;
};

// A group handed to a reader: a zero-copy view into the segment, valid until Ack or Release
// (or until the lease expires, after which the bytes may be reused: Decode checks them).
struct LeasedGroup {
  uint64_t frame_position = 0;
  uint32_t lease_slot = 0;
  uint64_t lease_generation = 0;
  uint64_t group_key = 0;
  uint32_t num_records = 0;
  int64_t min_version = 0;
  uint64_t checksum = 0;
  absl::Span<const uint8_t> payload;

  // True if the payload still has the checksum it was committed with (reads it once, in place).
  bool VerifyChecksum() const;
  // Verifies the checksum, then decodes the records.
  absl::StatusOr<std::vector<RolloutRecord>> Decode() const;
};

struct TakeOptions {
  int32_t max_groups = 1;
  // Staleness filter: groups with learner_version - min_version > max_lag are dropped.
  int64_t learner_version = 0;
  int64_t max_lag = INT64_MAX;
  absl::Duration timeout = absl::ZeroDuration();  // wait this long for the first group
  // Reclaim expired leases and those of dead readers before taking, whenever the last such
  // pass ran (otherwise at most every 10 ms): a reader that replaces a dead one gets what the
  // dead one held first, oldest first, in the order it was delivered.
  bool reclaim_first = false;
};

// Facts about a segment for `prl replay stat`, read without joining it.
struct SegmentInfo {
  std::string name;
  uint32_t layout_version = 0;
  std::string label;
  int32_t creator_pid = 0;
  bool creator_alive = false;  // false: a stale segment from a dead run
  int64_t created_unix_ns = 0;
  ReplayConfig config;
  ReplayStats stats;
};

class ReplayBuffer {
 public:
  // Creates segment `name` (owner-only permissions), its pages allocated at once, made whole
  // under a draft name and then published under `name` (so an Open never finds it half made).
  // If it exists: AlreadyExists naming the remedy, unless reclaim_stale is set and its creator is
  // dead (then it is replaced). A segment larger than /dev/shm's free space is
  // ResourceExhausted naming both sizes.
  static absl::StatusOr<std::unique_ptr<ReplayBuffer>> Create(const std::string& name,
                                                              const ReplayConfig& config,
                                                              bool reclaim_stale = false);
  // Joins an existing segment; another layout version, a size that disagrees with the header,
  // a corrupted header, or bookkeeping that fails its checks (replay/segment_check.h) are
  // errors naming what is wrong.
  static absl::StatusOr<std::unique_ptr<ReplayBuffer>> Open(const std::string& name);
  // Deletes a segment (`prl replay reset`); refuses while its creator lives unless force.
  static absl::Status Remove(const std::string& name, bool force);
  static absl::StatusOr<SegmentInfo> Inspect(const std::string& name);

  ~ReplayBuffer();

  // Writes one complete group. Full buffer: waits up to `timeout` for space (kBlock), then
  // ResourceExhausted; or drops the oldest ready groups (kDropOldest). A group larger than the
  // buffer is InvalidArgument at once.
  absl::Status WriteGroup(absl::Span<const RolloutRecord> records, absl::Duration timeout);
  // Leases up to max_groups ready groups, oldest first, waiting up to timeout for the first.
  // Returns an empty vector when none arrived in time.
  absl::StatusOr<std::vector<LeasedGroup>> Take(const TakeOptions& options);
  // The group is consumed. FailedPrecondition if the lease was lost (expired and re-delivered):
  // then the caller must discard what it read.
  absl::Status Ack(const LeasedGroup& group);
  // Hands the group back for delivery to another reader, unconsumed.
  absl::Status Release(const LeasedGroup& group);
  // Extends the group's lease to lease_ms from now: a reader whose work on it outlasts the
  // lease (a long training step) renews it meanwhile. FailedPrecondition if the lease was
  // already lost: then the caller must discard what it read.
  absl::Status Renew(const LeasedGroup& group);

  // The prompts of groups dropped for room (kDropOldest; a group's prompt is that of its
  // records, when its set id has at most 24 bytes), oldest first, at most `max`, not yet handed
  // back; `through` receives what to pass to ForgetDroppedPrompts once the coordinator took
  // them. They stay in the segment until then, so a reader that dies meanwhile loses none.
  std::vector<DroppedPrompt> DroppedPrompts(size_t max, uint64_t* through) const;
  void ForgetDroppedPrompts(uint64_t through);

  ReplayStats Stats() const;
  const std::string& name() const { return name_; }

 private:
  ReplayBuffer(std::string name, std::unique_ptr<replay_internal::Mapping> mapping);
  absl::Status WaitFor(std::atomic<uint32_t>* word, uint32_t seen, int64_t deadline_ns);

  std::string name_;
  std::unique_ptr<replay_internal::Mapping> mapping_;
};

// Segment names: [A-Za-z0-9._-], 1 to 200 characters.
absl::Status ValidateSegmentName(const std::string& name);

}  // namespace prl
