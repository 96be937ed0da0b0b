// The rollout record (ARCHITECTURE.md, "rollout record"): one finished sample with everything
// the learner needs (tokens, behaviour log-probs and token versions for the importance ratio,
// reward for the group-normalised advantage) and everything needed to trace it (ids, sampling
// parameters, timestamps). Records travel in groups: all samples of one prompt.
//
// Two encodings of the same record. The binary layout below is what the shared-memory replay
// buffer stores (the arrays are memcpy'd, so a 10M-token record encodes at memory speed);
// proto/prl/v1/replay.proto carries records across machines (replay/record_proto.h).
//
// Binary layout, version 1 (kRecordLayoutVersion). Little-endian; every offset below is from
// the start of the record; reserved and padding bytes are zero. The encoding is canonical:
// a valid record has exactly one encoding, and Decode∘Encode reproduces the bytes.
//
//   offset size  field
//        0    4  magic "PRLR"
//        4    2  u16 layout version (1)
//        6    1  u8  finish_reason (1 length, 2 stop, 3 abort)
//        7    1  reserved
//        8    8  u64 total_bytes: the whole record, a multiple of 8
//       16    8  u64 prompt_index          24  8  u64 group_id
//       32    4  u32 sample_index          36  4  u32 group_size
//       40    8  f64 reward                48  8  i64 created_unix_nanos
//       56    8  i64 finished_unix_nanos
//       64    4  f32 sampling.temperature  68  4  f32 sampling.top_p
//       72    4  i32 sampling.top_k        76  4  i32 sampling.max_tokens
//       80    8  u64 sampling.seed
//       88    4  u32 P = #prompt_tokens    92  4  u32 C = #completion_tokens
//       96    4  u32 S = #stop_token_ids  100  4  u32 R = #reward_components
//      104    3  u8 byte lengths of run_id, prompt_set_id, actor_id
//      107    5  reserved
//      112       sections, each starting at a multiple of 8 (zero padding in between):
//                  i32 prompt_tokens[P]      i32 completion_tokens[C]
//                  f32 behaviour_logprobs[C] i64 token_versions[C]
//                  i32 stop_token_ids[S]     f64 reward_component_values[R]
//                  strings: u8 name_lengths[R], then the bytes of run_id, prompt_set_id,
//                  actor_id and the R component names, back to back
//                then zero padding to total_bytes.
//
// Group layout, version 1 (what the buffer writes and delivers):
//
//        0    4  magic "PRLG"
//        4    2  u16 layout version (1)
//        6    2  reserved
//        8    4  u32 n = number of records (>= 1)
//       12    4  reserved
//       16  8(n+1) u64 offsets: record i is bytes [offsets[i], offsets[i+1]) of the group;
//                  offsets[0] = 16 + 8(n+1), records back to back, offsets[n] = group size.
//
// Decoding treats its input as untrusted: every count, length and offset is checked against
// the input before anything is read or allocated, and a decoded record passes ValidateRecord
// (a decoded group passes DescribeGroup). Fuzzed by fuzz/record_decode_fuzzer.cc.
//
// Thread-safety: all functions are pure; records are plain values.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace prl {

inline constexpr uint16_t kRecordLayoutVersion = 1;
inline constexpr size_t kMaxRecordIdBytes = 255;  // ids and reward component names

enum class RolloutFinishReason : uint8_t { kLength = 1, kStop = 2, kAbort = 3 };

// The sampling parameters the completion was drawn with (inference_engine/sampling_params.h).
struct RolloutSampling {
  float temperature = 1.0f;  // >= 0 and finite; 0 = greedy
  float top_p = 1.0f;        // in (0, 1]
  int32_t top_k = 0;         // >= 0; 0 disables
  int32_t max_tokens = 0;    // >= 0; completion tokens at most (0: not recorded)
  uint64_t seed = 0;
  std::vector<int32_t> stop_token_ids;  // each >= 0

  bool operator==(const RolloutSampling&) const = default;
};

// Invariants (ValidateRecord): ids and component names valid UTF-8 of at most 255 bytes;
// component names non-empty and distinct; sample_index < group_size; tokens >= 0; one
// behaviour log-prob (finite) and one token version (>= 0) per completion token; reward and
// component values finite; 0 <= created_unix_nanos <= finished_unix_nanos; sampling as
// documented above; every array and the component list hold fewer than 2^32 entries.
struct RolloutRecord {
  std::string run_id, prompt_set_id, actor_id;  // ids (UTF-8; each at most 255 bytes)
  uint64_t prompt_index = 0, group_id = 0;
  uint32_t sample_index = 0, group_size = 1;  // sample_index < group_size
  std::vector<int32_t> prompt_tokens, completion_tokens;
  std::vector<float> behaviour_logprobs;  // one per completion token
  std::vector<int64_t> token_versions;    // one per completion token
  double reward = 0.0;
  std::vector<std::pair<std::string, double>> reward_components;  // named parts of the reward
  RolloutFinishReason finish_reason = RolloutFinishReason::kLength;
  RolloutSampling sampling;
  int64_t created_unix_nanos = 0, finished_unix_nanos = 0;

  // Oldest token version (the sample's staleness is learner version minus this);
  // INT64_MAX when there are no completion tokens.
  int64_t min_version() const;
  // 64-bit key of the group (run_id, prompt_set_id, prompt_index, group_id); equal groups,
  // equal keys. XXH3-64 of a length-prefixed little-endian encoding of the four fields, so it
  // is the same in every process and on every machine.
  uint64_t GroupKey() const;

  bool operator==(const RolloutRecord&) const = default;
};

// All invariants above; errors are InvalidArgument naming the field, expected and found.
absl::Status ValidateRecord(const RolloutRecord& record);

// One record in the binary layout. EncodeRecordTo requires ValidateRecord(record).ok() and
// writes exactly EncodedRecordSize(record) bytes (a multiple of 8) to dst; with an 8-byte
// aligned dst every array lands naturally aligned.
size_t EncodedRecordSize(const RolloutRecord& record);
void EncodeRecordTo(const RolloutRecord& record, uint8_t* dst);
// Untrusted input: validates every length/offset, never reads out of bounds, rejects unknown
// layout versions and trailing bytes (the span must be exactly one record).
absl::StatusOr<RolloutRecord> DecodeRecord(absl::Span<const uint8_t> bytes);

// A group — the unit the buffer writes and delivers (all samples of one prompt).
struct GroupInfo {
  uint64_t key = 0;            // GroupKey() of its records
  uint32_t size = 0;           // number of records
  int64_t min_version = 0;     // min over its records' min_version()
  uint64_t payload_bytes = 0;  // EncodeGroupTo's output size
};

// Checks the records form one complete group: at least one; same run/prompt-set/prompt/group
// ids; group_size == count for all; sample indices exactly 0..n-1 (any order); each
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
