// libFuzzer target for the rollout record decoders, which read bytes other processes wrote
// into the shared-memory replay buffer (replay/record_decoder.h, replay/rollout_group.h).
//
// Beyond "no crash, no sanitizer report, no hang", every accepted input must be canonical
// (re-encoding what was decoded reproduces it byte for byte) and valid: a decoded record
// passes ValidateRecord, a decoded group passes DescribeGroup. Each input is tried both as a
// group and as a single record. Built with clang by scripts/fuzz.sh; the same entry point
// replays fuzz/corpus/record_decode in ctest.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "replay/record_decoder.h"
#include "replay/record_encoder.h"
#include "replay/rollout_group.h"
#include "replay/rollout_record.h"

namespace {

bool SameBytes(const std::vector<uint8_t>& encoded, const uint8_t* data, size_t size) {
  return encoded.size() == size && (size == 0 || std::memcmp(encoded.data(), data, size) == 0);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::Span<const uint8_t> bytes(data, size);

  const absl::StatusOr<std::vector<prl::RolloutRecord>> group = prl::DecodeGroup(bytes);
  if (group.ok()) {
    const absl::StatusOr<prl::GroupInfo> info = prl::DescribeGroup(*group);
    if (!info.ok() || info->payload_bytes != size) std::abort();
    std::vector<uint8_t> encoded(info->payload_bytes);
    prl::EncodeGroupTo(*group, encoded.data());
    if (!SameBytes(encoded, data, size)) std::abort();
  } else if (group.status().message().empty()) {
    std::abort();  // errors must explain themselves
  }

  const absl::StatusOr<prl::RolloutRecord> record = prl::DecodeRecord(bytes);
  if (record.ok()) {
    if (!prl::ValidateRecord(*record).ok()) std::abort();
    std::vector<uint8_t> encoded(prl::EncodedRecordSize(*record));
    prl::EncodeRecordTo(*record, encoded.data());
    if (!SameBytes(encoded, data, size)) std::abort();
  } else if (record.status().message().empty()) {
    std::abort();
  }
  return 0;
}
