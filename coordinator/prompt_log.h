// PromptLog: the coordinator's durable, append-only log of accepted prompt sets, completed
// groups and cancellations (prl.v1.LogRecord), replayed on restart.
//
// Durability. A record is durable once WaitDurable for its ticket (or Append) returned OK: it
// is written and fdatasync'd, and the file's and its directory's creation were fsync'd. With
// group commit (the default) appends that arrive while an fsync is running share the next
// one: the first waiter writes everything pending and fsyncs, the others wait for it. Every
// write and fsync result is checked; after a failed one the log refuses every later call (the
// page cache's state is unknown after a failed fsync): the coordinator must restart and
// replay. Record stamps: a record without unix_ms gets the time of its Write.
//
// Bounded. Compact(live) atomically replaces the whole log with a snapshot of the live state
// (a temporary file, fsync, rename, directory fsync); a crash at any point leaves the old log
// or the new one. Replaying the snapshot must rebuild the state the log held.
//
// Strict. Open cuts a torn tail (a crash mid-append, never acknowledged) and says how many
// bytes; a damaged record followed by a record committed after it is corruption: Open refuses
// the file naming the offset (coordinator/prompt_log_format.h has the layout and the rule).
// A log of the previous layout is rewritten in the current one at open.
//
// Exclusive. Open takes an exclusive flock on "<path>.lock", which holds the owner's pid: a
// second coordinator on the same log fails at Open naming that pid. The lock dies with its
// process, so a killed coordinator never blocks its successor.
//
// Asynchronous waiters. OnDurable(ticket, done) returns at once; `done` runs when the record is
// durable, on the log's flusher thread (started by the first OnDurable), which commits for all
// such waiters together: a server completes its calls on durability instead of parking a
// thread per call in WaitDurable. Synchronous and asynchronous waiters share the fsyncs.
//
// Thread-safety: every method may be called from any thread. Records reach the file in the
// order their Write calls returned.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/status/statusor.h"
#include "prl/v1/prompt.pb.h"

namespace prl::coordinator {

struct PromptLogOptions {
  // true: concurrent appends share one fsync (group commit). false: every Write writes and
  // fsyncs its record before it returns, one at a time (the baseline of
  // `prl bench coordinator`).
  bool group_commit = true;
  // Tests: runs before every fsync of the log (e.g. to hold one while other calls proceed).
  std::function<void()> before_sync;
};

struct PromptLogStats {
  int64_t records = 0;         // appended since open
  int64_t fsyncs = 0;          // of the log file, since open
  int64_t compactions = 0;     // since open
  int64_t bytes = 0;           // the log's length, including what is not yet written
  int64_t snapshot_bytes = 0;  // its length after the last compaction (0: none since open)
};

class PromptLog {
 public:
  struct Opened {
    std::unique_ptr<PromptLog> log;
    std::vector<prl::v1::LogRecord> records;  // in append order
    int64_t torn_bytes = 0;                   // cut off the end
    bool migrated = false;                    // rewritten from the previous layout
  };
  // Opens the log at `path`, creating it (and its directories) if missing.
  static absl::StatusOr<Opened> Open(const std::string& path, const PromptLogOptions& options = {});
  ~PromptLog();
  PromptLog(const PromptLog&) = delete;
  PromptLog& operator=(const PromptLog&) = delete;

  // Write + WaitDurable: durable when it returns OK.
  absl::Status Append(const prl::v1::LogRecord& record);
  // Queues the record behind every earlier one and returns its ticket; not yet durable (with
  // group_commit false it is durable already). Callers that apply records under a lock of
  // their own call Write under it and WaitDurable after releasing it, so that the fsync is
  // shared.
  absl::StatusOr<uint64_t> Write(const prl::v1::LogRecord& record);
  // Returns once the record of `ticket` and every one before it are durable.
  absl::Status WaitDurable(uint64_t ticket);
  // Calls done(OK) once the record of `ticket` and every one before it are durable, or
  // done(error) once the log failed: before returning if that is known already, else on the
  // flusher thread. `done` must be quick and must not call back into this log. Every `done` is
  // called, at the latest by the destructor.
  void OnDurable(uint64_t ticket, absl::AnyInvocable<void(absl::Status)> done);
  // Replaces the log by `live` (see above). Everything written before is made durable first;
  // on an error before the rename the old log stays in use, unchanged.
  absl::Status Compact(const std::vector<prl::v1::LogRecord>& live);

  const std::string& path() const { return path_; }
  // The ticket of the newest record written (0: none): WaitDurable of it makes everything
  // written so far durable.
  uint64_t last_ticket() const;
  int64_t bytes() const;
  PromptLogStats stats() const;

 private:
  PromptLog(std::string path, const PromptLogOptions& options, int fd, int lock_fd, uint64_t bytes);
  // Writes pending_ and fsyncs: the caller is the commit leader. Releases `lock` during the
  // I/O when `unlock_for_io`.
  void FlushLocked(std::unique_lock<std::mutex>& lock, bool unlock_for_io);
  absl::Status FailLocked(absl::Status status);
  // The flusher thread: flushes while OnDurable waiters are queued and calls them.
  void FlushForWaiters();

  struct Waiter {
    uint64_t ticket;
    absl::AnyInvocable<void(absl::Status)> done;
  };

  const std::string path_;
  const PromptLogOptions options_;
  const int lock_fd_;  // holds the flock

  mutable std::mutex mu_;
  std::condition_variable flushed_;
  int fd_;
  absl::Status failed_;          // sticky: the first failed write or fsync
  std::string pending_;          // framed records not yet handed to write(2)
  uint64_t flush_end_;           // file offset where pending_ goes (after any batch in flight)
  bool flushing_ = false;        // a leader is writing a batch
  uint64_t next_ticket_ = 0;     // the last ticket handed out
  uint64_t durable_ticket_ = 0;  // every ticket up to this is durable
  PromptLogStats stats_;
  std::vector<Waiter> waiters_;  // OnDurable's, not yet called
  std::condition_variable waiters_added_;
  bool stopping_ = false;
  std::thread flusher_;  // started by the first OnDurable
};

}  // namespace prl::coordinator
