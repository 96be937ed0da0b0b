// Futex waits on 32-bit words in shared memory (Linux), used for shared-memory "data
// ready" and "space free" notifications across processes. A dead process cannot block a futex,
// and every wait has a time limit.
#pragma once

#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <climits>
#include <cstdint>

namespace prl {

// Sleeps while *word == expected, at most timeout_ns (spurious wake-ups are fine).
inline void FutexWait(std::atomic<uint32_t>* word, uint32_t expected, int64_t timeout_ns) {
  if (timeout_ns <= 0) return;
  const timespec ts{static_cast<time_t>(timeout_ns / 1'000'000'000),
                    static_cast<long>(timeout_ns % 1'000'000'000)};
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

// Bumps *word and wakes every waiter on it.
inline void FutexBumpAndWake(std::atomic<uint32_t>* word) {
  word->fetch_add(1, std::memory_order_release);
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

}  // namespace prl
