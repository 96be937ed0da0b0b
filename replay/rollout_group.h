// A rollout group — the unit the replay buffer writes and delivers: all samples of one prompt,
// as one byte string (the group layout of replay/record_layout.h: a header, an offset table,
// the encoded records back to back), optionally checksummed (XXH3-64) while it is written.
//
// Decoding treats its input as untrusted, as DecodeRecord does (replay/record_decoder.h), and a
// decoded group passes DescribeGroup. Fuzzed by fuzz/record_decode_fuzzer.cc.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "replay/rollout_record.h"

namespace prl {

struct GroupInfo {
  uint64_t key = 0;            // GroupKey() of its records
  uint32_t size = 0;           // number of records (more than group_size when agents' episodes
                               // are of several segments)
  int64_t min_version = 0;     // min over its records' min_version()
  uint64_t payload_bytes = 0;  // EncodeGroupTo's output size
};

// Checks the records form one complete group: at least one; same run/prompt-set/prompt/group
// ids and group_size for all; every episode 0..group_size-1 present with each of its segments
// 0..segments-1 exactly once (one record per episode when none is split; any order); each
// ValidateRecord. Errors name the record (by position) and the field.
// scan_values = false skips the per-element scans of the completion (token ids >= 0, finite
// log-probs, versions >= 0) and leaves min_version unset (INT64_MAX), for a caller that
// encodes with EncodeGroupToWithChecksum, which does both while copying.
absl::StatusOr<GroupInfo> DescribeGroup(absl::Span<const RolloutRecord> records,
                                        bool scan_values = true);
// Requires DescribeGroup(records).ok(); writes its payload_bytes to dst, records in the order
// given.
void EncodeGroupTo(absl::Span<const RolloutRecord> records, uint8_t* dst);
struct EncodedGroup {
  uint64_t checksum = 0;    // XXH3-64 of the bytes written (== XXH3_64bits(dst, payload_bytes))
  int64_t min_version = 0;  // as GroupInfo::min_version
};
// EncodeGroupTo that also hashes the bytes and checks the completion's token ids, log-probs
// and versions, each piece right after copying it while it is still in cache. A bad value is
// an error naming the record and element (DescribeGroup's format); the bytes are then garbage.
absl::StatusOr<EncodedGroup> EncodeGroupToWithChecksum(absl::Span<const RolloutRecord> records,
                                                       uint8_t* dst);
// Untrusted input, validated like DecodeRecord; the result passes DescribeGroup and keeps the
// encoded order.
absl::StatusOr<std::vector<RolloutRecord>> DecodeGroup(absl::Span<const uint8_t> bytes);

}  // namespace prl
