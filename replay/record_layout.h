// The binary layout of rollout records and groups, version 3 (kRecordLayoutVersion): what the
// shared-memory replay buffer stores (internal to replay/; the encoder, decoder and group
// framing share these definitions, so they cannot disagree on a byte).
//
// Record. Little-endian; every offset below is from the start of the record; reserved and
// padding bytes are zero. The encoding is canonical: a valid record has exactly one encoding,
// and Decode∘Encode reproduces the bytes.
//
//   offset size  field
//        0    4  magic "PRLR"
//        4    2  u16 layout version (3)
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
//      107    1  u8  route_top_k (K)          108  2  u16 route_layers (L)
//      110    2  reserved
//      112    4  u32 T = #turns               116  4  u32 M = #token_sources (0 or C)
//      120    4  u32 segment                124  4  u32 segments (>= 1)
//      128       sections, each starting at a multiple of 8 (zero padding in between):
//                  i32 prompt_tokens[P]      i32 completion_tokens[C]
//                  f32 behaviour_logprobs[C] i64 token_versions[C]
//                  i32 stop_token_ids[S]     f64 reward_component_values[R]
//                  u8 token_sources[M]       u32 turn_ends[T]
//                  f64 turn_rewards[T]       u8 routes[C * L * K]
//                  strings: u8 name_lengths[R], then the bytes of run_id, prompt_set_id,
//                  actor_id and the R component names, back to back
//                then zero padding to total_bytes.
// (Version 1 had a 112-byte header and no token_sources, turns or routes; version 2 had 8
// reserved bytes where segment and segments are.)
//
// Group (what the buffer writes and delivers):
//
//        0    4  magic "PRLG"
//        4    2  u16 layout version (3)
//        6    2  reserved
//        8    4  u32 n = number of records (>= 1)
//       12    4  reserved
//       16  8(n+1) u64 offsets: record i is bytes [offsets[i], offsets[i+1]) of the group;
//                  offsets[0] = 16 + 8(n+1), records back to back, offsets[n] = group size.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "replay/rollout_record.h"

namespace prl::replay_internal {

// The arrays are memcpy'd between records and the layout; a big-endian host would need swaps.
static_assert(std::endian::native == std::endian::little, "the record layout is little-endian");

inline constexpr char kRecordMagic[4] = {'P', 'R', 'L', 'R'};
inline constexpr char kGroupMagic[4] = {'P', 'R', 'L', 'G'};

// The first 128 bytes of a record, exactly as laid out above.
struct RecordHeader {
  char magic[4];
  uint16_t layout_version;
  uint8_t finish_reason;
  uint8_t reserved0;
  uint64_t total_bytes;
  uint64_t prompt_index;
  uint64_t group_id;
  uint32_t sample_index;
  uint32_t group_size;
  double reward;
  int64_t created_unix_nanos;
  int64_t finished_unix_nanos;
  float temperature;
  float top_p;
  int32_t top_k;
  int32_t max_tokens;
  uint64_t seed;
  uint32_t num_prompt_tokens;
  uint32_t num_completion_tokens;
  uint32_t num_stop_token_ids;
  uint32_t num_reward_components;
  uint8_t run_id_bytes;
  uint8_t prompt_set_id_bytes;
  uint8_t actor_id_bytes;
  uint8_t route_top_k;
  uint16_t route_layers;
  uint16_t reserved1;
  uint32_t num_turns;
  uint32_t num_token_sources;
  uint32_t segment;
  uint32_t segments;
};
static_assert(sizeof(RecordHeader) == 128);
static_assert(offsetof(RecordHeader, route_layers) == 108 && offsetof(RecordHeader, num_turns) == 112);
static_assert(offsetof(RecordHeader, reward) == 40 && offsetof(RecordHeader, temperature) == 64);
static_assert(offsetof(RecordHeader, num_prompt_tokens) == 88);
static_assert(offsetof(RecordHeader, run_id_bytes) == 104);

// The first 16 bytes of a group; the offset table follows.
struct GroupHeader {
  char magic[4];
  uint16_t layout_version;
  uint16_t reserved0;
  uint32_t num_records;
  uint32_t reserved1;
};
static_assert(sizeof(GroupHeader) == 16);

constexpr uint64_t AlignUp8(uint64_t n) { return (n + 7) & ~uint64_t{7}; }

// A record's counts: what its header says of its sections' sizes.
struct RecordCounts {
  uint64_t prompt = 0, completion = 0, stop = 0, components = 0;
  uint64_t sources = 0, turns = 0, route_bytes = 0;  // route_bytes = C * L * K
  uint64_t string_bytes = 0;  // ids and component names, without the name lengths
};

// Where the string section of a record starts and where the record ends, from its counts
// (sections in the order above). Encoder and decoder both size records with this. Counts
// (route_bytes included) are below 2^32 and strings below 2^8 (R + 3) bytes, so every value
// stays below 2^40: no uint64_t overflow.
struct RecordLayout {
  uint64_t strings;
  uint64_t total;
};

inline RecordLayout ComputeLayout(const RecordCounts& c) {
  uint64_t at = sizeof(RecordHeader);
  for (const uint64_t section_bytes :
       {4 * c.prompt, 4 * c.completion, 4 * c.completion, 8 * c.completion, 4 * c.stop,
        8 * c.components, c.sources, 4 * c.turns, 8 * c.turns, c.route_bytes}) {
    at = AlignUp8(at + section_bytes);
  }
  const uint64_t num_components = c.components, string_bytes = c.string_bytes;
  // The strings: one length byte per component name, then the bytes of the ids and names.
  return {at, AlignUp8(at + num_components + string_bytes)};
}

// The bytes of a record's ids and component names (the string section without the lengths).
inline uint64_t StringBytes(const RolloutRecord& r) {
  uint64_t n = r.run_id.size() + r.prompt_set_id.size() + r.actor_id.size();
  for (const auto& [name, value] : r.reward_components) n += name.size();
  return n;
}

inline RecordCounts CountsOf(const RolloutRecord& r) {
  return {r.prompt_tokens.size(), r.completion_tokens.size(),
          r.sampling.stop_token_ids.size(), r.reward_components.size(),
          r.token_sources.size(), r.turn_ends.size(), r.routes.size(), StringBytes(r)};
}

// How errors show a magic: quoted, non-printable bytes escaped.
inline std::string MagicString(const char (&magic)[4]) {
  return absl::StrCat("\"", absl::CHexEscape(absl::string_view(magic, 4)), "\"");
}

}  // namespace prl::replay_internal
