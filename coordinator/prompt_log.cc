#include "coordinator/prompt_log.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "coordinator/prompt_log_format.h"
#include "core/mapped_file.h"
#include "core/status_macros.h"

namespace prl::coordinator {

namespace fs = std::filesystem;
using log_format::kMagicBytes;
using log_format::kMagicV2;

namespace {

absl::Status Errno(absl::string_view what, const std::string& path) {
  return absl::InternalError(absl::StrCat(what, " ", path, ": ", std::strerror(errno)));
}

absl::Status WriteAt(int fd, absl::string_view bytes, uint64_t offset, const std::string& path) {
  while (!bytes.empty()) {
    const ssize_t n = pwrite(fd, bytes.data(), bytes.size(), static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      return Errno("cannot write the prompt log", path);
    }
    bytes.remove_prefix(static_cast<size_t>(n));
    offset += static_cast<uint64_t>(n);
  }
  return absl::OkStatus();
}

absl::Status Sync(int fd, const std::string& path) {
  if (fdatasync(fd) != 0) return Errno("cannot fsync the prompt log", path);
  return absl::OkStatus();
}

// Creates `dir` and its missing parents, fsyncing each new entry's parent directory.
absl::Status CreateDirectoriesDurably(const fs::path& dir) {
  if (dir.empty() || fs::is_directory(dir)) return absl::OkStatus();
  PRL_RETURN_IF_ERROR(CreateDirectoriesDurably(dir.parent_path()));
  std::error_code ec;
  if (!fs::create_directory(dir, ec) && ec) {
    return absl::InternalError(absl::StrCat("cannot create ", dir.string(), ": ", ec.message()));
  }
  return FsyncDirectory(dir.has_parent_path() ? dir.parent_path().string() : ".");
}

// The exclusive lock "<path>.lock": its fd (held open for the log's lifetime).
absl::StatusOr<int> LockLog(const std::string& path) {
  const std::string lock_path = path + ".lock";
  const int fd = open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) return Errno("cannot open the prompt log's lock", lock_path);
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    char text[32] = {};
    const ssize_t n = pread(fd, text, sizeof(text) - 1, 0);
    close(fd);
    if (err != EWOULDBLOCK) {
      errno = err;
      return Errno("cannot lock the prompt log", lock_path);
    }
    int64_t pid = 0;
    const bool known =
        n > 0 && absl::SimpleAtoi(absl::StripAsciiWhitespace(absl::string_view(text, n)), &pid);
    return absl::FailedPreconditionError(
        absl::StrCat("prompt log ", path, " is in use by another coordinator (pid ",
                     known ? absl::StrCat(pid) : "unknown", ", holding ", lock_path,
                     "): stop it first, or give this coordinator a log of its own"));
  }
  const std::string pid = absl::StrCat(getpid(), "\n");
  if (ftruncate(fd, 0) != 0 || pwrite(fd, pid.data(), pid.size(), 0) < 0) {
    const absl::Status status = Errno("cannot write the prompt log's lock", lock_path);
    close(fd);
    return status;
  }
  return fd;
}

// Appends LogRecord.unix_ms (field 4, a varint) to a serialised record that has none: on the
// wire a later field is merged into the message, so the record itself is not copied.
void StampUnixMs(const prl::v1::LogRecord& record, std::string* payload) {
  if (record.unix_ms() != 0) return;
  uint64_t v = static_cast<uint64_t>(absl::ToUnixMillis(absl::Now()));
  payload->push_back(static_cast<char>(4 << 3));
  while (v >= 0x80) {
    payload->push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  payload->push_back(static_cast<char>(v));
}

absl::StatusOr<std::string> Payload(const prl::v1::LogRecord& record) {
  std::string payload;
  if (!record.SerializeToString(&payload) || payload.size() > log_format::kMaxPayloadBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "prompt log record: expected at most 1 GiB serialised, found ", payload.size(), " bytes"));
  }
  StampUnixMs(record, &payload);
  return payload;
}

absl::StatusOr<std::string> ReadAll(int fd, const std::string& path) {
  struct stat st;
  if (fstat(fd, &st) != 0) return Errno("cannot stat the prompt log", path);
  std::string contents(static_cast<size_t>(st.st_size), '\0');
  size_t at = 0;
  while (at < contents.size()) {
    const ssize_t n = pread(fd, contents.data() + at, contents.size() - at, static_cast<off_t>(at));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return Errno("cannot read the prompt log", path);
    at += static_cast<size_t>(n);
  }
  return contents;
}

// A new log (or one whose creation was cut short before its magic was durable): writes the
// magic and makes the file and its name durable.
absl::Status Initialise(int fd, const std::string& path) {
  if (ftruncate(fd, 0) != 0) return Errno("cannot truncate the prompt log", path);
  PRL_RETURN_IF_ERROR(WriteAt(fd, kMagicV2, 0, path));
  if (fsync(fd) != 0) return Errno("cannot fsync the prompt log", path);
  return FsyncDirectory(ParentDirectory(path));
}

}  // namespace

PromptLog::PromptLog(std::string path, const PromptLogOptions& options, int fd, int lock_fd,
                     uint64_t bytes)
    : path_(std::move(path)), options_(options), lock_fd_(lock_fd), fd_(fd), flush_end_(bytes) {
  stats_.bytes = static_cast<int64_t>(bytes);
}

absl::StatusOr<PromptLog::Opened> PromptLog::Open(const std::string& path,
                                                  const PromptLogOptions& options) {
  PRL_RETURN_IF_ERROR(CreateDirectoriesDurably(fs::path(path).parent_path()));
  PRL_ASSIGN_OR_RETURN(const int lock_fd, LockLog(path));
  const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) {
    const absl::Status status = Errno("cannot open the prompt log", path);
    close(lock_fd);
    return status;
  }
  // From here the log owns both descriptors.
  std::unique_ptr<PromptLog> log(new PromptLog(path, options, fd, lock_fd, 0));
  PRL_ASSIGN_OR_RETURN(const std::string contents, ReadAll(fd, path));
  Opened out;
  if (contents.size() < kMagicBytes && kMagicV2.substr(0, contents.size()) == contents) {
    PRL_RETURN_IF_ERROR(Initialise(fd, path));
    log->flush_end_ = kMagicBytes;
    log->stats_.bytes = kMagicBytes;
    out.log = std::move(log);
    return out;
  }
  PRL_ASSIGN_OR_RETURN(log_format::ReadLog read, log_format::Read(contents, path));
  if (read.torn_bytes > 0) {
    if (ftruncate(fd, static_cast<off_t>(read.valid_bytes)) != 0) {
      return Errno("cannot cut the torn tail of the prompt log", path);
    }
    PRL_RETURN_IF_ERROR(Sync(fd, path));
  }
  log->flush_end_ = read.valid_bytes;
  log->stats_.bytes = static_cast<int64_t>(read.valid_bytes);
  out.torn_bytes = static_cast<int64_t>(read.torn_bytes);
  out.records = std::move(read.records);
  if (read.layout != 2) {
    PRL_RETURN_IF_ERROR(log->Compact(out.records));
    out.migrated = true;
  }
  out.log = std::move(log);
  return out;
}

PromptLog::~PromptLog() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  waiters_added_.notify_all();
  if (flusher_.joinable()) flusher_.join();
  close(fd_);
  close(lock_fd_);  // releases the flock
}

absl::Status PromptLog::FailLocked(absl::Status status) {
  failed_ = absl::Status(status.code(), absl::StrCat(status.message(),
                                                     "; the prompt log takes no more records: "
                                                     "restart the coordinator to replay it"));
  flushed_.notify_all();
  return failed_;
}

absl::StatusOr<uint64_t> PromptLog::Write(const prl::v1::LogRecord& record) {
  PRL_ASSIGN_OR_RETURN(const std::string payload, Payload(record));
  std::unique_lock<std::mutex> lock(mu_);
  PRL_RETURN_IF_ERROR(failed_);
  // Records of one batch carry the batch's first offset (prompt_log_format.h).
  log_format::AppendFramed(payload, flush_end_, &pending_);
  const uint64_t ticket = ++next_ticket_;
  ++stats_.records;
  stats_.bytes = static_cast<int64_t>(flush_end_ + pending_.size());
  if (!options_.group_commit) {
    FlushLocked(lock, /*unlock_for_io=*/false);
    PRL_RETURN_IF_ERROR(failed_);
  }
  return ticket;
}

absl::Status PromptLog::WaitDurable(uint64_t ticket) {
  std::unique_lock<std::mutex> lock(mu_);
  while (durable_ticket_ < ticket) {
    PRL_RETURN_IF_ERROR(failed_);
    if (flushing_) {
      flushed_.wait(lock);
    } else {
      FlushLocked(lock, /*unlock_for_io=*/true);
    }
  }
  return absl::OkStatus();
}

void PromptLog::OnDurable(uint64_t ticket, absl::AnyInvocable<void(absl::Status)> done) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!failed_.ok() || durable_ticket_ >= ticket) {
    const absl::Status status = failed_;
    lock.unlock();
    return done(status);
  }
  waiters_.push_back({ticket, std::move(done)});
  if (!flusher_.joinable()) flusher_ = std::thread([this] { FlushForWaiters(); });
  waiters_added_.notify_one();
}

void PromptLog::FlushForWaiters() {
  std::unique_lock<std::mutex> lock(mu_);
  std::vector<Waiter> ready;
  while (true) {
    // Everyone whose record is durable (or all of them, once the log failed) is called outside
    // the lock; then the rest are flushed for.
    auto rest = std::partition(waiters_.begin(), waiters_.end(), [&](const Waiter& w) {
      return !failed_.ok() || w.ticket <= durable_ticket_;
    });
    if (rest != waiters_.begin()) {
      ready.assign(std::make_move_iterator(waiters_.begin()), std::make_move_iterator(rest));
      waiters_.erase(waiters_.begin(), rest);
      const absl::Status status = failed_;
      lock.unlock();
      for (Waiter& w : ready) w.done(status);
      ready.clear();
      lock.lock();
      continue;
    }
    if (waiters_.empty()) {
      if (stopping_) return;
      waiters_added_.wait(lock);
    } else if (flushing_) {
      flushed_.wait(lock);
    } else {
      FlushLocked(lock, /*unlock_for_io=*/true);
    }
  }
}

absl::Status PromptLog::Append(const prl::v1::LogRecord& record) {
  PRL_ASSIGN_OR_RETURN(const uint64_t ticket, Write(record));
  return WaitDurable(ticket);
}

void PromptLog::FlushLocked(std::unique_lock<std::mutex>& lock, bool unlock_for_io) {
  if (pending_.empty()) return;
  flushing_ = true;
  std::string batch;
  batch.swap(pending_);
  const uint64_t start = flush_end_, last = next_ticket_;
  flush_end_ += batch.size();
  if (unlock_for_io) lock.unlock();
  absl::Status status = WriteAt(fd_, batch, start, path_);
  if (status.ok() && options_.before_sync) options_.before_sync();
  if (status.ok()) status = Sync(fd_, path_);
  if (unlock_for_io) lock.lock();
  flushing_ = false;
  if (!status.ok()) {
    FailLocked(status).IgnoreError();  // sticky: every waiter and later call reads failed_
    return;
  }
  ++stats_.fsyncs;
  durable_ticket_ = last;
  flushed_.notify_all();
}

absl::Status PromptLog::Compact(const std::vector<prl::v1::LogRecord>& live) {
  std::unique_lock<std::mutex> lock(mu_);
  flushed_.wait(lock, [&] { return !flushing_; });
  PRL_RETURN_IF_ERROR(failed_);
  FlushLocked(lock, /*unlock_for_io=*/false);
  PRL_RETURN_IF_ERROR(failed_);
  std::string bytes(kMagicV2);
  for (const prl::v1::LogRecord& record : live) {
    PRL_ASSIGN_OR_RETURN(const std::string payload, Payload(record));
    log_format::AppendFramed(payload, kMagicBytes, &bytes);
  }
  const std::string tmp = path_ + ".compact";
  const int fd = open(tmp.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return Errno("cannot create the prompt log snapshot", tmp);
  absl::Status wrote = WriteAt(fd, bytes, 0, tmp);
  if (wrote.ok() && fsync(fd) != 0) wrote = Errno("cannot fsync the prompt log snapshot", tmp);
  if (wrote.ok() && rename(tmp.c_str(), path_.c_str()) != 0) {
    wrote = Errno("cannot rename the prompt log snapshot over", path_);
  }
  if (!wrote.ok()) {
    close(fd);
    unlink(tmp.c_str());
    return wrote;  // the old log is intact and stays in use
  }
  close(fd_);
  fd_ = fd;
  flush_end_ = bytes.size();
  stats_.bytes = stats_.snapshot_bytes = static_cast<int64_t>(bytes.size());
  ++stats_.compactions;
  const absl::Status dir = FsyncDirectory(ParentDirectory(path_));
  if (!dir.ok()) return FailLocked(dir);
  return absl::OkStatus();
}

uint64_t PromptLog::last_ticket() const {
  std::lock_guard<std::mutex> lock(mu_);
  return next_ticket_;
}

int64_t PromptLog::bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_.bytes;
}

PromptLogStats PromptLog::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

}  // namespace prl::coordinator
