// LeaseLock: mutual exclusion in shared memory that a dead holder cannot keep.
//
// Debian 12's Boost 1.74 has no robust interprocess mutex: a process killed while holding one
// would hang every other process. This lock is instead a lease held by a named process
// (core/process_identity.h token): a waiter that finds the holder dead takes the lease over.
// Every metadata write made under the lock goes through an undo log (Set), so the new holder
// first rolls back whatever the dead one had half done; every critical section is therefore
// all-or-nothing. Critical sections are short (bookkeeping only — payload bytes are copied
// outside the lock), so waiting is spin, then yield, then sleep.
//
// All protected fields are std::atomic<uint64_t> inside the same mapping, addressed in the log
// by their offset from the mapping's base, so the log means the same in every process.
//
// The undo log is bounded by design, never exhausted: every critical section writes a fixed
// part of fewer than kSectionReserve fields, plus loops (dropping, expiring, leasing many
// groups) whose every iteration also writes fewer than kSectionReserve and starts only while
// HasRoom(); a loop that runs out of room stops and leaves the rest to the caller's next
// section. So Set never finds the log full (its check is an invariant, not a limit).
//
// The lease names a process, not a thread: the threads of one process (the replay ingest
// serves several pushes at once) first queue on a process-local mutex, so that at most one of
// them contends for the lease (and a waiting thread sleeps in the kernel instead of polling).
// Sections never nest: a thread that opens a second one is a programming error, checked.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>

namespace prl {

inline constexpr uint64_t kUndoLogCapacity = 16384;
// Upper bound of the fields written by a section's fixed part, and by one loop iteration.
inline constexpr uint64_t kSectionReserve = 128;

struct alignas(64) LockState {
  std::atomic<uint64_t> owner;       // ProcessToken of the holder; 0 when free
  std::atomic<uint64_t> takeovers;   // leases taken over from dead holders
  std::atomic<uint64_t> undo_count;  // valid entries of the holder's undo log
  struct Entry {
    std::atomic<uint64_t> offset;     // of the field, from the mapping base
    std::atomic<uint64_t> old_value;  // its value before the holder's first write
  };
  Entry undo[kUndoLogCapacity];
};

class LockedSection {
 public:
  // Acquires the lease on `state` (which lives in the mapping of `mapped_bytes` starting at
  // `base`), taking it over from a dead holder and rolling back its unfinished section if
  // needed. Waits while another thread of this process holds a section.
  LockedSection(LockState* state, uint8_t* base, uint64_t mapped_bytes);
  // Commits (forgets the undo log) and releases.
  ~LockedSection();
  LockedSection(const LockedSection&) = delete;
  LockedSection& operator=(const LockedSection&) = delete;

  // Logged write of a protected field.
  void Set(std::atomic<uint64_t>& field, uint64_t value);
  void Add(std::atomic<uint64_t>& field, uint64_t delta) { Set(field, Get(field) + delta); }
  static uint64_t Get(const std::atomic<uint64_t>& field) {
    return field.load(std::memory_order_relaxed);
  }
  // True if this acquisition took the lease over from a dead holder.
  bool took_over() const { return took_over_; }
  // Whether a loop may run one more iteration (see above), `pending` fields that the
  // section will still write after the loop already counted.
  bool HasRoom(uint64_t pending = 0) const {
    return state_->undo_count.load(std::memory_order_relaxed) + pending + 2 * kSectionReserve <=
           kUndoLogCapacity;
  }

 private:
  void Rollback();

  std::unique_lock<std::mutex> in_process_;  // released after the lease (declared first)
  LockState* state_;
  uint8_t* base_;
  uint64_t mapped_bytes_;
  bool took_over_ = false;
};

// The undo log of a lock found in a mapping of `mapped_bytes`: empty "" if every entry it
// holds addresses a field inside the mapping, else what is wrong (checked on attach, before a
// takeover would roll the entries back).
std::string CheckUndoLog(const LockState& state, uint64_t mapped_bytes);

}  // namespace prl
