// The prompt log's bytes on disk (internal to coordinator/prompt_log.cc): how a record is
// framed, and how a log is read back, telling a torn tail (cut) from corruption (an error).
//
// Layout 2 (magic "PRLLOG2\n"), little-endian, records back to back after the magic:
//   u64 payload XXH3-64 | u64 batch_start | u32 payload bytes | u32 header check | payload
// where the payload is a serialised prl.v1.LogRecord, the header check is the low 32 bits of
// XXH3-64 over the header's first 20 bytes, and batch_start is the file offset at which the
// record's commit batch began. Invariant (group commit): every byte before a record's
// batch_start was durable (fsync'd) before any byte of the record was written.
//
// Reading. A damaged record (bad header, bad payload, or running past the end) at offset A is
//   - a torn tail when no valid record follows it: cut at A;
//   - a torn batch when the first valid record after it has batch_start <= A: A was in the
//     same commit batch, whose fsync never returned, so nothing from A on was acknowledged:
//     cut at A;
//   - corruption otherwise (a valid record of a later batch follows: A had been durable):
//     an error naming offset A.
// Layout 1 ("PRLLOG1\n": u32 length | u64 XXH3 | payload, no batches) is read for migration:
// a bad record followed by more bytes that hold a good one is corruption, else a torn tail.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "prl/v1/prompt.pb.h"

namespace prl::coordinator::log_format {

inline constexpr absl::string_view kMagicV2("PRLLOG2\n", 8);
inline constexpr absl::string_view kMagicV1("PRLLOG1\n", 8);
inline constexpr size_t kMagicBytes = 8;
inline constexpr size_t kHeaderBytes = 24;
inline constexpr uint32_t kMaxPayloadBytes = 1u << 30;

// Appends one framed record (layout 2) to `out`.
void AppendFramed(absl::string_view payload, uint64_t batch_start, std::string* out);

struct ReadLog {
  int layout = 2;                           // 1: an old log, to be rewritten as layout 2
  std::vector<prl::v1::LogRecord> records;  // in append order
  uint64_t valid_bytes = 0;                 // the file is cut to this length
  uint64_t torn_bytes = 0;                  // what followed the last good record
};

// Reads a whole log file's contents (which start with either magic). DataLoss naming `path`
// and the offset for corruption, or a file that is not a prompt log.
absl::StatusOr<ReadLog> Read(absl::string_view contents, const std::string& path);

}  // namespace prl::coordinator::log_format
