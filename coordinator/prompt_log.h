// PromptLog: the coordinator's durable, append-only log of accepted prompt sets, completed
// groups and cancellations (prl.v1.LogRecord), replayed on restart.
//
// File format: the 8-byte magic "PRLLOG1\n", then records of [u32 payload bytes][u64 XXH3 of
// the payload][payload: a serialised LogRecord], little-endian. Append returns only after the
// record is written and fsync'd, so whatever a client was told was accepted survives a crash.
// A crash mid-append can leave a torn last record, which was never acknowledged: Open cuts it
// off (and says how many bytes). A bad record followed by good ones is corruption, not a torn
// tail: Open refuses the file, naming the offset.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "prl/v1/prompt.pb.h"

namespace prl::coordinator {

class PromptLog {
 public:
  struct Opened {
    std::unique_ptr<PromptLog> log;
    std::vector<prl::v1::LogRecord> records;  // in append order
    int64_t torn_bytes = 0;                   // cut off the end
  };
  // Opens the log at `path`, creating it (and its directory) if missing.
  static absl::StatusOr<Opened> Open(const std::string& path);
  ~PromptLog();
  PromptLog(const PromptLog&) = delete;
  PromptLog& operator=(const PromptLog&) = delete;

  // Durable when it returns OK. Not thread-safe: the coordinator serialises appends.
  absl::Status Append(const prl::v1::LogRecord& record);
  const std::string& path() const { return path_; }
  int64_t bytes() const { return bytes_; }

 private:
  PromptLog(std::string path, int fd, int64_t bytes)
      : path_(std::move(path)), fd_(fd), bytes_(bytes) {}

  std::string path_;
  int fd_;
  int64_t bytes_;
};

}  // namespace prl::coordinator
