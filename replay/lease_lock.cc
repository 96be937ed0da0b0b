#include "replay/lease_lock.h"

#include <sched.h>
#include <signal.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "core/check.h"
#include "core/process_identity.h"

namespace prl {

namespace {

inline void CpuRelax() {
#if defined(__x86_64__)
  __builtin_ia32_pause();
#endif
}

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// How long a holder may keep the lease before waiters check that it is still alive.
constexpr int64_t kLivenessCheckNs = 20'000'000;

// Fault injection for the crash tests: PRL_REPLAY_KILL_AFTER_SETS=N makes this process
// SIGKILL itself at its N-th logged write, i.e. in the middle of a critical section.
int64_t KillAfterSets() {
  static const int64_t n = [] {
    const char* v = std::getenv("PRL_REPLAY_KILL_AFTER_SETS");
    return v == nullptr ? int64_t{-1} : std::atoll(v);
  }();
  return n;
}
std::atomic<int64_t> sets_done{0};

// One holder per process at a time (see the header): the lease cannot tell threads apart.
std::mutex& InProcessMutex() {
  static std::mutex* mutex = new std::mutex;
  return *mutex;
}

// Whether this thread is inside a section (of any lock: the mutex above is one per process).
thread_local bool in_section = false;

std::mutex& InProcessMutexForANewSection() {
  PRL_CHECK(!in_section, "LeaseLock sections never nest: this thread is in one already");
  return InProcessMutex();
}

}  // namespace

LockedSection::LockedSection(LockState* state, uint8_t* base, uint64_t mapped_bytes)
    : in_process_(InProcessMutexForANewSection()),
      state_(state),
      base_(base),
      mapped_bytes_(mapped_bytes) {
  const uint64_t me = SelfProcessToken();
  PRL_CHECK(me != 0, "no process token");
  int64_t waited_since = 0;
  uint64_t last_owner = 0;
  for (int attempt = 0;; ++attempt) {
    uint64_t expected = 0;
    if (state_->owner.compare_exchange_weak(expected, me, std::memory_order_acquire)) break;
    if (attempt < 64) {
      CpuRelax();
      continue;
    }
    if (attempt < 256) {
      sched_yield();
      continue;
    }
    const int64_t now = NowNs();
    if (expected != last_owner) {  // a new holder: restart its clock
      last_owner = expected;
      waited_since = now;
    } else if (now - waited_since > kLivenessCheckNs) {
      if (!ProcessAlive(expected) &&
          state_->owner.compare_exchange_strong(expected, me, std::memory_order_acquire)) {
        std::atomic_thread_fence(std::memory_order_seq_cst);
        Rollback();
        state_->takeovers.fetch_add(1, std::memory_order_relaxed);
        took_over_ = true;
        break;
      }
      waited_since = now;
    }
    const timespec pause{0, 50'000};  // 50 us
    nanosleep(&pause, nullptr);
  }
  PRL_CHECK(state_->undo_count.load() == 0, "undo log not empty after acquisition");
  in_section = true;
}

LockedSection::~LockedSection() {
  // The commit point: once the log is empty, the section's writes stand.
  state_->undo_count.store(0, std::memory_order_seq_cst);
  in_section = false;
  state_->owner.store(0, std::memory_order_release);
}

void LockedSection::Set(std::atomic<uint64_t>& field, uint64_t value) {
  const uint64_t n = state_->undo_count.load(std::memory_order_relaxed);
  PRL_CHECK(n < kUndoLogCapacity, "invariant broken: a critical section wrote ", n,
            " fields without checking HasRoom (the undo log holds ", kUndoLogCapacity, ")");
  const uint8_t* address = reinterpret_cast<const uint8_t*>(&field);
  state_->undo[n].offset.store(static_cast<uint64_t>(address - base_), std::memory_order_relaxed);
  state_->undo[n].old_value.store(field.load(std::memory_order_relaxed), std::memory_order_relaxed);
  // The entry is in the log before the field changes (seq_cst orders the stores).
  state_->undo_count.store(n + 1, std::memory_order_seq_cst);
  if (KillAfterSets() >= 0 && sets_done.fetch_add(1) == KillAfterSets()) raise(SIGKILL);
  field.store(value, std::memory_order_relaxed);
}

void LockedSection::Rollback() {
  // Entries were checked on attach (CheckUndoLog); one that a stray write damaged since is
  // skipped rather than followed outside the mapping.
  const uint64_t n = std::min(state_->undo_count.load(std::memory_order_seq_cst), kUndoLogCapacity);
  for (uint64_t i = n; i-- > 0;) {
    const uint64_t offset = state_->undo[i].offset.load();
    if (offset % 8 != 0 || offset + 8 > mapped_bytes_) continue;
    auto* field = reinterpret_cast<std::atomic<uint64_t>*>(base_ + offset);
    field->store(state_->undo[i].old_value.load(), std::memory_order_relaxed);
  }
  state_->undo_count.store(0, std::memory_order_seq_cst);
}

std::string CheckUndoLog(const LockState& state, uint64_t mapped_bytes) {
  const uint64_t n = state.undo_count.load();
  if (n > kUndoLogCapacity) {
    return absl::StrCat("lock.undo_count is ", n, ", expected at most ", kUndoLogCapacity);
  }
  for (uint64_t i = 0; i < n; ++i) {
    const uint64_t offset = state.undo[i].offset.load();
    if (offset % 8 != 0 || offset + 8 > mapped_bytes) {
      return absl::StrCat("lock.undo[", i, "].offset is ", offset,
                          ", expected an 8-aligned field inside the ", mapped_bytes,
                          "-byte mapping");
    }
  }
  return "";
}

}  // namespace prl
