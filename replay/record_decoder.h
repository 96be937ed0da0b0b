// The strict decoder of one rollout record from the binary layout (replay/record_layout.h).
//
// The input is untrusted (bytes other processes wrote into shared memory): every count, length
// and offset is checked against the input before anything is read or allocated, unknown layout
// versions, non-zero reserved or padding bytes and trailing bytes are rejected, and the decoded
// record passes ValidateRecord. So a record is accepted only in its one canonical encoding:
// EncodeRecordTo(DecodeRecord(bytes)) == bytes. Fuzzed by fuzz/record_decode_fuzzer.cc.
// Groups: replay/rollout_group.h.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "replay/rollout_record.h"

namespace prl {

// `bytes` must be exactly one record; never reads out of bounds. Errors are InvalidArgument
// starting "rollout record: ", naming the field, expected and found.
absl::StatusOr<RolloutRecord> DecodeRecord(absl::Span<const uint8_t> bytes);

}  // namespace prl
