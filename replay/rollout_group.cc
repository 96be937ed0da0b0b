#include "replay/rollout_group.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "core/check.h"
#include "core/status_macros.h"
#include "core/xxhash_inline.h"
#include "replay/record_encoder.h"
#include "replay/record_internal.h"
#include "replay/record_layout.h"
#include "replay/record_writer.h"

namespace prl {

namespace {

using replay_internal::GroupHeader;
using replay_internal::Invalid;
using replay_internal::kMaxCount;
using replay_internal::Prefixed;

// How DescribeGroup shows a group id in errors: strings quoted, numbers as they are.
std::string Shown(const std::string& id) { return absl::StrCat("\"", id, "\""); }
uint64_t Shown(uint64_t number) { return number; }

// The group header and offset table, then every record; with a hash, every byte is hashed in
// payload order, and with check_values the records' values are checked as they are copied
// (EncodeRecordWith).
absl::Status EncodeGroupWith(absl::Span<const RolloutRecord> records, uint8_t* dst,
                             XXH3_state_t* hash, bool check_values, int64_t* min_version) {
  PRL_CHECK(!records.empty() && records.size() <= kMaxCount, "EncodeGroupTo: ", records.size(),
            " records");
  const size_t n = records.size();
  GroupHeader h;
  std::memset(&h, 0, sizeof(h));
  std::memcpy(h.magic, replay_internal::kGroupMagic, 4);
  h.layout_version = kRecordLayoutVersion;
  h.num_records = static_cast<uint32_t>(n);
  replay_internal::Writer out(dst, hash);
  out.Put(&h, sizeof(h));
  uint64_t offset = sizeof(GroupHeader) + 8 * (n + 1);
  out.Put(&offset, 8);
  for (const RolloutRecord& r : records) {
    offset += EncodedRecordSize(r);
    out.Put(&offset, 8);
  }
  for (size_t i = 0; i < n; ++i) {
    // Continues the hash in payload order.
    const absl::Status s = replay_internal::EncodeRecordWith(records[i], dst + out.at(), hash,
                                                             check_values, min_version);
    if (!s.ok()) return Prefixed(absl::StrCat("group record ", i, ": "), s);
    out.Skip(EncodedRecordSize(records[i]));
  }
  return absl::OkStatus();
}

absl::Status GroupError(absl::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat("rollout group: ", message));
}

// The offset table of a group, once its header is checked and the offsets are known to split
// exactly bytes.size() into n spans in order. Reads nothing past bytes.size().
absl::StatusOr<std::vector<uint64_t>> CheckGroupFrame(absl::Span<const uint8_t> bytes) {
  GroupHeader h;
  if (bytes.size() < sizeof(h)) {
    return GroupError(absl::StrCat("truncated: expected at least the ", sizeof(h),
                                   "-byte header, found ", bytes.size(), " bytes"));
  }
  std::memcpy(&h, bytes.data(), sizeof(h));
  if (std::memcmp(h.magic, replay_internal::kGroupMagic, 4) != 0) {
    return GroupError(absl::StrCat("magic: expected ",
                                   replay_internal::MagicString(replay_internal::kGroupMagic),
                                   ", found ", replay_internal::MagicString(h.magic)));
  }
  if (h.layout_version != kRecordLayoutVersion) {
    return GroupError(absl::StrCat("layout_version: expected ", kRecordLayoutVersion, ", found ",
                                   h.layout_version));
  }
  if (h.reserved0 != 0 || h.reserved1 != 0) {
    return GroupError("reserved header bytes: expected zero, found non-zero");
  }
  if (h.num_records == 0) return GroupError("num_records: expected at least 1, found 0");
  const uint64_t n = h.num_records;
  uint64_t table_end = 0;  // 16 + 8 (n + 1): n < 2^32 cannot overflow, checked all the same
  if (__builtin_mul_overflow(n + 1, uint64_t{8}, &table_end) ||
      __builtin_add_overflow(table_end, uint64_t{sizeof(h)}, &table_end) ||
      table_end > bytes.size()) {
    return GroupError(absl::StrCat("truncated: ", n,
                                   " records need an offset table ending at byte ",
                                   sizeof(h) + 8 * (n + 1), ", found ", bytes.size(), " bytes"));
  }
  std::vector<uint64_t> offsets(n + 1);
  std::memcpy(offsets.data(), bytes.data() + sizeof(h), 8 * (n + 1));
  if (offsets[0] != table_end) {
    return GroupError(absl::StrCat("offsets[0]: expected ", table_end,
                                   " (the end of the table), found ", offsets[0]));
  }
  if (offsets[n] != bytes.size()) {
    return GroupError(absl::StrCat("offsets[", n, "]: expected ", bytes.size(),
                                   " (the size of the group), found ", offsets[n]));
  }
  for (uint64_t i = 0; i < n; ++i) {
    // Non-decreasing and within the group; the record decoder checks each span's size.
    if (offsets[i + 1] < offsets[i] || offsets[i + 1] > bytes.size()) {
      return GroupError(absl::StrCat("offsets[", i + 1, "]: expected in [", offsets[i], ", ",
                                     bytes.size(), "], found ", offsets[i + 1]));
    }
  }
  return offsets;
}

}  // namespace

absl::StatusOr<GroupInfo> DescribeGroup(absl::Span<const RolloutRecord> records, bool scan_values) {
  if (records.empty()) {
    return absl::InvalidArgumentError("group: expected at least one record, found none");
  }
  const size_t n = records.size();
  const RolloutRecord& first = records[0];
  GroupInfo info;
  info.key = first.GroupKey();
  info.size = static_cast<uint32_t>(n);
  info.min_version = std::numeric_limits<int64_t>::max();
  info.payload_bytes = sizeof(GroupHeader) + 8 * (n + 1);
  // Per episode: its segments (from its first record), the positions holding each segment.
  const uint32_t episodes = first.group_size;
  if (episodes > n) {
    return Invalid("group_size", absl::StrCat("at most the number of records (", n, ")"),
                   first.group_size);
  }
  std::vector<uint32_t> segments_of(episodes, 0);
  std::vector<std::vector<int64_t>> seen_at(episodes);
  for (size_t i = 0; i < n; ++i) {
    const RolloutRecord& r = records[i];
    const std::string where = absl::StrCat("group record ", i, ": ");
    PRL_RETURN_IF_ERROR(Prefixed(where, replay_internal::ValidateRecordWith(r, scan_values)));
    auto same = [&](absl::string_view field, const auto& found, const auto& expected) {
      if (found == expected) return absl::OkStatus();
      return Prefixed(
          where, Invalid(field, absl::StrCat(Shown(expected), " (as record 0)"), Shown(found)));
    };
    PRL_RETURN_IF_ERROR(same("run_id", r.run_id, first.run_id));
    PRL_RETURN_IF_ERROR(same("prompt_set_id", r.prompt_set_id, first.prompt_set_id));
    PRL_RETURN_IF_ERROR(same("prompt_index", r.prompt_index, first.prompt_index));
    PRL_RETURN_IF_ERROR(same("group_id", r.group_id, first.group_id));
    PRL_RETURN_IF_ERROR(same("group_size", r.group_size, first.group_size));
    // sample_index < group_size and segment < segments (ValidateRecord).
    std::vector<int64_t>& at = seen_at[r.sample_index];
    if (at.empty()) {
      // Every segment of an episode is a record of this group: a larger count is corrupt.
      if (r.segments > n) {
        return Prefixed(where, Invalid("segments",
                                       absl::StrCat("at most the number of records (", n, ")"),
                                       r.segments));
      }
      segments_of[r.sample_index] = r.segments;
      at.assign(r.segments, -1);
    } else if (r.segments != segments_of[r.sample_index]) {
      return Prefixed(where, Invalid("segments",
                                     absl::StrCat(segments_of[r.sample_index], " (as episode ",
                                                  r.sample_index, "'s other records)"),
                                     r.segments));
    }
    if (at[r.segment] >= 0) {
      return Prefixed(where, Invalid("sample_index",
                                     "each (sample_index, segment) once",
                                     absl::StrCat(r.sample_index, " segment ", r.segment,
                                                  " again (also record ", at[r.segment], ")")));
    }
    at[r.segment] = static_cast<int64_t>(i);
    if (scan_values) info.min_version = std::min(info.min_version, r.min_version());
    info.payload_bytes += EncodedRecordSize(r);
  }
  size_t expected = 0;
  for (uint32_t j = 0; j < episodes; ++j) {
    if (seen_at[j].empty()) {
      return Invalid("group", absl::StrCat("every episode 0..", episodes - 1, " (group_size ",
                                           episodes, ")"),
                     absl::StrCat("none of episode ", j));
    }
    expected += seen_at[j].size();
  }
  if (expected != n) {  // (every segment is then present: each was seen at most once)
    return Invalid("group", absl::StrCat(expected, " records (each episode's segments)"),
                   absl::StrCat(n));
  }
  return info;
}

void EncodeGroupTo(absl::Span<const RolloutRecord> records, uint8_t* dst) {
  EncodeGroupWith(records, dst, nullptr, /*check_values=*/false, nullptr).IgnoreError();
}

absl::StatusOr<EncodedGroup> EncodeGroupToWithChecksum(absl::Span<const RolloutRecord> records,
                                                       uint8_t* dst) {
  XXH3_state_t* state = XXH3_createState();
  PRL_CHECK(state != nullptr && XXH3_64bits_reset(state) == XXH_OK, "XXH3 state");
  EncodedGroup out;
  out.min_version = std::numeric_limits<int64_t>::max();
  const absl::Status s =
      EncodeGroupWith(records, dst, state, /*check_values=*/true, &out.min_version);
  out.checksum = XXH3_64bits_digest(state);
  XXH3_freeState(state);
  if (!s.ok()) return s;
  return out;
}

absl::StatusOr<std::vector<RolloutRecord>> DecodeGroup(absl::Span<const uint8_t> bytes) {
  PRL_ASSIGN_OR_RETURN(const std::vector<uint64_t> offsets, CheckGroupFrame(bytes));
  const uint64_t n = offsets.size() - 1;
  std::vector<RolloutRecord> records;
  records.reserve(std::min<uint64_t>(n, bytes.size() / sizeof(replay_internal::RecordHeader)));
  for (uint64_t i = 0; i < n; ++i) {
    absl::StatusOr<RolloutRecord> record =
        replay_internal::DecodeRecordBody(bytes.subspan(offsets[i], offsets[i + 1] - offsets[i]));
    if (!record.ok()) {
      return Prefixed(absl::StrCat("rollout group: record ", i, " at byte ", offsets[i], ": "),
                      record.status());
    }
    records.push_back(*std::move(record));
  }
  const absl::StatusOr<GroupInfo> info = DescribeGroup(records);
  if (!info.ok()) return Prefixed("rollout ", info.status());
  return records;
}

}  // namespace prl
