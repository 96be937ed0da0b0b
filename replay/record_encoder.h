// The encoder of one rollout record into the binary layout (replay/record_layout.h). Encoding
// is a copy: the arrays are memcpy'd (large ones with non-temporal stores), so a 10M-token
// record encodes at memory speed. Groups: replay/rollout_group.h.
//
// Thread-safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>

#include "replay/rollout_record.h"

namespace prl {

// The exact encoded size of `record`, a multiple of 8.
size_t EncodedRecordSize(const RolloutRecord& record);
// Requires ValidateRecord(record).ok() and writes exactly EncodedRecordSize(record) bytes to
// dst; with an 8-byte aligned dst every array lands naturally aligned.
void EncodeRecordTo(const RolloutRecord& record, uint8_t* dst);

}  // namespace prl
