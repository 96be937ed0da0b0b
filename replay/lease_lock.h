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
// The lease names a process, not a thread: the threads of one process (the replay ingest
// serves several pushes at once) first queue on a process-local mutex, so that at most one of
// them contends for the lease. Sections never nest.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>

namespace prl {

inline constexpr uint64_t kUndoLogCapacity = 16384;

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
  // Acquires the lease on `state` (which lives in the mapping starting at `base`), taking it
  // over from a dead holder and rolling back its unfinished section if needed.
  LockedSection(LockState* state, uint8_t* base);
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

 private:
  void Rollback();

  std::unique_lock<std::mutex> in_process_;  // released after the lease (declared first)
  LockState* state_;
  uint8_t* base_;
  bool took_over_ = false;
};

}  // namespace prl
