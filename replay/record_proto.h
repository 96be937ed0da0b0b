// Conversion between the rollout record (replay/rollout_record.h) and its protobuf form
// (proto/prl/v1/replay.proto) for the replay buffer's remote ingest. Every field maps one to
// one; FromProto validates the result as ValidateRecord does, so a remote record is held to
// the same invariants as a local one.
#pragma once

#include "absl/status/statusor.h"
#include "prl/v1/replay.pb.h"
#include "replay/rollout_record.h"

namespace prl {

// Overwrites *proto with `record` (which should pass ValidateRecord; ToProto does not check).
void ToProto(const RolloutRecord& record, prl::v1::RolloutRecord* proto);
// InvalidArgument naming the field when the proto lacks `sampling`, has finish_reason
// UNSPECIFIED or a value this build does not know, or breaks a ValidateRecord invariant.
absl::StatusOr<RolloutRecord> FromProto(const prl::v1::RolloutRecord& proto);

}  // namespace prl
