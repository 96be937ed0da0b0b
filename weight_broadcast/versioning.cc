#include "weight_broadcast/versioning.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace prl {

absl::Status VersionSequence::CheckNext(int64_t version, absl::string_view where,
                                        absl::string_view hint) const {
  if (version < 0 || version >= kVersionLimit) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": version must be in [0, 2^62), found ", version));
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (version <= floor_) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": versions must increase: version ", floor_,
                     last_published_ == floor_ ? " was published already" : " is held already",
                     ", found ", version, hint));
  }
  return absl::OkStatus();
}

void VersionSequence::Published(int64_t version) {
  std::lock_guard<std::mutex> lock(mu_);
  last_published_ = std::max(last_published_, version);
  floor_ = std::max(floor_, version);
  newest_ = std::max(newest_, version);
}

void VersionSequence::Held(int64_t version) {
  std::lock_guard<std::mutex> lock(mu_);
  floor_ = std::max(floor_, version);
  newest_ = std::max(newest_, version);
}

void VersionSequence::Reported(int64_t version) {
  std::lock_guard<std::mutex> lock(mu_);
  newest_ = std::max(newest_, version);
}

int64_t VersionSequence::last_published() const {
  std::lock_guard<std::mutex> lock(mu_);
  return last_published_;
}

int64_t VersionSequence::newest() const {
  std::lock_guard<std::mutex> lock(mu_);
  return newest_;
}

int64_t FirstVersionToPublish(int64_t learner_version, int64_t transport_newest) {
  return std::max(learner_version, transport_newest + 1);
}

}  // namespace prl
