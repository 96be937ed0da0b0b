#include "weight_broadcast/mailbox.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"

namespace prl::weight_broadcast_internal {

namespace {
// condition_variable::wait_for overflows on absl::InfiniteDuration.
std::chrono::nanoseconds Bounded(absl::Duration d) {
  return absl::ToChronoNanoseconds(std::clamp(d, absl::ZeroDuration(), absl::Hours(24 * 365)));
}
}  // namespace

absl::StatusOr<WeightBuffer> WeightMailbox::AcquireBuffer() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = retired_.begin(); it != retired_.end(); ++it) {
      // Only this list holds it, and only the newest version is ever handed out: nobody can
      // take a new reference. The fence orders the last holder's reads (released by its
      // reference drop) before our writes.
      if (it->use_count() == 1) {
        std::atomic_thread_fence(std::memory_order_acquire);
        WeightBuffer reused = std::move(*it);
        retired_.erase(it);
        return reused;
      }
    }
  }
  WeightBuffer buffer;
  if (spec_.adapter.has_value()) {
    PRL_ASSIGN_OR_RETURN(LoraSet set,
                         LoraSet::Allocate(spec_.model, *spec_.adapter, device_, /*zeroed=*/false));
    buffer.adapter = std::make_shared<LoraSet>(std::move(set));
  } else {
    PRL_ASSIGN_OR_RETURN(ParameterSet set,
                         ParameterSet::Allocate(spec_.model, device_, /*zeroed=*/false));
    buffer.params = std::make_shared<ParameterSet>(std::move(set));
  }
  return buffer;
}

void WeightMailbox::Deliver(int64_t version, WeightBuffer weights, absl::Duration transfer) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!latest_.empty()) {
    retired_.push_back(std::move(latest_));
    if (retired_.size() > kMaxRetired) retired_.erase(retired_.begin());
  }
  if (stats_.last_version >= 0) stats_.versions_skipped += version - stats_.last_version - 1;
  latest_ = std::move(weights);
  latest_version_ = version;
  stats_.versions_received += 1;
  stats_.last_version = version;
  stats_.bytes_received += static_cast<int64_t>(latest_.bytes());
  stats_.last_transfer_seconds = absl::ToDoubleSeconds(transfer);
  stats_.total_transfer_seconds += stats_.last_transfer_seconds;
  changed_.notify_all();
}

void WeightMailbox::Fail(absl::Status status) {
  std::lock_guard<std::mutex> lock(mu_);
  failure_ = std::move(status);
  stats_.last_error = failure_.ToString();
  changed_.notify_all();
}

void WeightMailbox::Close() {
  std::lock_guard<std::mutex> lock(mu_);
  closed_ = true;
  changed_.notify_all();
}

void WeightMailbox::NoteRetry() {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.retries += 1;
}

void WeightMailbox::NoteReconnect(const absl::Status& why) {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.reconnects += 1;
  if (!why.ok()) stats_.last_error = why.ToString();
}

void WeightMailbox::NoteError(const absl::Status& why) {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.last_error = why.ToString();
}

void WeightMailbox::NoteChecksumFailure(absl::string_view what) {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.checksum_failures += 1;
  stats_.last_error = std::string(what);
}

void WeightMailbox::NoteIgnored(int64_t version) {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.versions_ignored += 1;
  stats_.last_error = absl::StrCat("dropped version ", version, ": not newer than version ",
                                   latest_version_, " held here");
}

bool WeightMailbox::SleepUnlessClosed(absl::Duration duration) {
  std::unique_lock<std::mutex> lock(mu_);
  changed_.wait_for(lock, Bounded(duration), [&] { return closed_; });
  return !closed_;
}

bool WeightMailbox::closed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return closed_;
}

int64_t WeightMailbox::last_version() const {
  std::lock_guard<std::mutex> lock(mu_);
  return latest_version_;
}

absl::StatusOr<std::optional<VersionedWeights>> WeightMailbox::TakeNewer(int64_t have) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (!failure_.ok()) return failure_;
  if (latest_version_ <= have) return std::nullopt;
  return Latest();
}

absl::StatusOr<VersionedWeights> WeightMailbox::WaitNewer(int64_t have,
                                                          absl::Duration timeout) const {
  std::unique_lock<std::mutex> lock(mu_);
  changed_.wait_for(lock, Bounded(timeout),
                    [&] { return !failure_.ok() || closed_ || latest_version_ > have; });
  if (!failure_.ok()) return failure_;
  if (latest_version_ > have) return Latest();
  if (closed_) return absl::CancelledError("weight subscriber closed while waiting");
  return absl::DeadlineExceededError(absl::StrCat(
      "no weight version newer than ", have, " within ", absl::FormatDuration(timeout),
      " (newest received: ", latest_version_,
      stats_.last_error.empty() ? "" : absl::StrCat("; last error: ", stats_.last_error), ")"));
}

VersionedWeights WeightMailbox::Latest() const {
  return VersionedWeights{latest_version_, latest_.params, latest_.adapter};
}

SubscriberStats WeightMailbox::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

}  // namespace prl::weight_broadcast_internal
