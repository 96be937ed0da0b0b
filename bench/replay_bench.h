// `prl bench replay`: records/s and GB/s through the shared-memory replay buffer for 1 KB,
// 64 KB and 4 MB records, with 1 and 4 writer processes and 2 reader processes, beside plain
// memcpy bandwidth measured in the same run.
//
// Writers encode records into the segment (WriteGroup, groups of one record); readers take
// them, verify each payload's checksum in place (zero-copy: the bytes are read once), and ack.
// The clock runs from the moment every process is ready until the last record is acked.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "bench/report.h"

namespace prl::bench {

struct ReplayBenchOptions {
  std::vector<int64_t> record_bytes = {1 << 10, 64 << 10, 4 << 20};
  std::vector<int> writers = {1, 4};
  int readers = 2;
  int64_t bytes_per_run = int64_t{2048} << 20;  // payload moved per measurement
  int64_t capacity_bytes = int64_t{256} << 20;
  bool progress = true;
};

absl::StatusOr<Report> RunReplayBench(const ReplayBenchOptions& options);

}  // namespace prl::bench
