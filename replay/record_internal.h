// Internal to replay/: what the rollout record's validation (rollout_record.cc), encoder
// (record_encoder.cc), decoder (record_decoder.cc) and group framing (rollout_group.cc) share:
// the one error format, the value scans, and the unprefixed entry point of each piece that the
// group framing builds on. Not an API: use the public headers of those files.
#pragma once

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <limits>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "core/xxhash_inline.h"
#include "replay/rollout_record.h"

namespace prl::replay_internal {

// Arrays and the component list hold at most this many entries (their counts are u32).
inline constexpr uint64_t kMaxCount = std::numeric_limits<uint32_t>::max();

// Every record error reads "field: expected E, found F".
template <typename Found>
absl::Status Invalid(absl::string_view field, absl::string_view expected, const Found& found) {
  return absl::InvalidArgumentError(
      absl::StrCat(field, ": expected ", expected, ", found ", found));
}

// `status` with `prefix` before its message (where in a group or a byte stream it happened).
inline absl::Status Prefixed(absl::string_view prefix, const absl::Status& status) {
  if (status.ok()) return status;
  return absl::Status(status.code(), absl::StrCat(prefix, status.message()));
}

// Index of the first element for which bad(x) holds, or n. Scans blocks with a branch-free
// OR (which the compiler vectorises) and searches only the block that fails: records reach
// tens of millions of elements.
template <typename T, typename Bad>
size_t FirstBad(const T* v, size_t n, Bad bad) {
  constexpr size_t kBlock = 4096;
  for (size_t b = 0; b < n; b += kBlock) {
    const size_t end = std::min(n, b + kBlock);
    uint32_t any = 0;  // an integer OR vectorises; a bool one does not
    for (size_t i = b; i < end; ++i) any |= static_cast<uint32_t>(bad(v[i]));
    if (any != 0) return static_cast<size_t>(std::find_if(v + b, v + end, bad) - v);
  }
  return n;
}

// NaN or infinity, from the bits (std::isfinite does not vectorise without -ffast-math).
inline bool NotFinite(float x) { return (std::bit_cast<uint32_t>(x) & 0x7f800000u) == 0x7f800000u; }

// ValidateRecord; scan_values = false skips the per-element scans of the completion (token ids,
// log-probs, versions), which EncodeRecordWith(check_values = true) runs while copying.
// (rollout_record.cc)
absl::Status ValidateRecordWith(const RolloutRecord& r, bool scan_values);

// EncodeRecordTo into dst with every byte also fed to `hash` (null: none), in order. With
// check_values, also scans the completion's token ids, log-probs and versions as they are
// copied, returns the first bad one (the bytes are then garbage), and lowers *min_version to
// the oldest token version. (record_encoder.cc)
absl::Status EncodeRecordWith(const RolloutRecord& r, uint8_t* dst, XXH3_state_t* hash,
                              bool check_values, int64_t* min_version);

// DecodeRecord without the "rollout record: " prefix on its errors. (record_decoder.cc)
absl::StatusOr<RolloutRecord> DecodeRecordBody(absl::Span<const uint8_t> bytes);

}  // namespace prl::replay_internal
