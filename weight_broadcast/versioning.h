// The version rule every weight publisher enforces, and how a restarted learner resumes its
// numbering.
//
// Versions are int64 in [0, 2^62) (the shared-memory transports pack one with a slot bit) and
// strictly increase per publisher. A publisher also learns of versions it did not publish:
//   - held:     versions the transport itself still holds from an earlier publisher (the
//               newest slot of a shm or cuda_ipc segment). Every subscriber already has or will
//               take it, so a new version must be above it: Publish refuses anything else.
//   - reported: versions subscribers say they have (nccl: in their announcements). Only
//               advisory: a subscriber ignores a version not newer than its own, the others
//               take it.
// newest() is the highest of all three; the learner reads it through
// WeightPublisher::newest_version() when it starts, and numbers its next version with
// FirstVersionToPublish.
//
// Thread-safety: every method from any thread.
#pragma once

#include <cstdint>
#include <mutex>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace prl {

// Versions must be below this (one bit of a shared-memory word names a slot).
inline constexpr int64_t kVersionLimit = int64_t{1} << 62;

class VersionSequence {
 public:
  // OK if `version` may be published next: in [0, kVersionLimit) and above every version
  // published or held. Otherwise InvalidArgument prefixed with `where`, naming both versions,
  // followed by `hint` (what the operator can do about it).
  absl::Status CheckNext(int64_t version, absl::string_view where,
                         absl::string_view hint = "") const;
  // Records a version published through this sequence (CheckNext passed).
  void Published(int64_t version);
  void Held(int64_t version);
  void Reported(int64_t version);

  int64_t last_published() const;  // -1: nothing published through this sequence
  int64_t newest() const;          // -1: no version known at all

 private:
  mutable std::mutex mu_;
  int64_t last_published_ = -1;
  int64_t floor_ = -1;  // the highest version published or held
  int64_t newest_ = -1;
};

// The version a learner whose own state is at `learner_version` (its checkpoint's) publishes
// next, given the newest version the transport knows of: its own, unless subscribers already
// hold a newer one, whose numbering it then continues.
int64_t FirstVersionToPublish(int64_t learner_version, int64_t transport_newest);

}  // namespace prl
