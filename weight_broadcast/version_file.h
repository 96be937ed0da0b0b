// The newest weight version a network publisher (gRPC, collective) made visible, kept in a
// small file beside the run so that a restarted publisher knows it at once. The shared-memory
// transports keep it in their segment; a network transport otherwise learns it only from
// subscribers that reconnect and report it, possibly after the restarted learner has already
// numbered below what they hold (versioning.h) — and they would then ignore its versions until
// it caught up.
//
// Format: the version in decimal and a newline, rewritten atomically and durably
// (core/mapped_file.h) before the version is shown to any subscriber, so the file is never
// below a version a subscriber may hold.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace prl {

// -1 if the file does not exist; DataLoss naming the file if it holds no valid version.
absl::StatusOr<int64_t> ReadPublishedVersion(const std::string& path);
absl::Status WritePublishedVersion(const std::string& path, int64_t version);

}  // namespace prl
