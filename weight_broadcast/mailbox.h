// WeightMailbox (internal to weight_broadcast/): the receiving half that every subscriber
// shares — the newest complete version, the buffers versions are received into, the waits and
// the statistics. A transport's receiver thread fills it; TakeNewer / WaitNewer read it.
//
// Double buffering: a version is received into a ParameterSet that nobody else holds (a new
// one, or a retired version whose last outside reference is gone) and handed out only once
// complete, after which it is never written again. So an engine keeps running on the version
// it has while the next one arrives, and the mutex is held only for pointer copies: TakeNewer
// never waits for a transfer.
//
// Thread-safety: AcquireBuffer and Deliver from the one receiver thread; everything else from
// any thread.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "weight_broadcast/weight_transport.h"

namespace prl::weight_broadcast_internal {

// The memory one version is received into: a ParameterSet, or a LoraSet for an adapter spec.
struct WeightBuffer {
  std::shared_ptr<ParameterSet> params;
  std::shared_ptr<LoraSet> adapter;

  void* data() const { return params ? params->buffer.data() : adapter->buffer.data(); }
  Device device() const { return params ? params->buffer.device() : adapter->buffer.device(); }
  size_t bytes() const { return params ? params->buffer.bytes() : adapter->buffer.bytes(); }
  long use_count() const { return params ? params.use_count() : adapter.use_count(); }
  bool empty() const { return params == nullptr && adapter == nullptr; }
};

class WeightMailbox {
 public:
  WeightMailbox(const WeightSpec& spec, Device device) : spec_(spec), device_(device) {}

  // A buffer to receive the next version into (contents undefined).
  absl::StatusOr<WeightBuffer> AcquireBuffer();
  // Exposes a completely received version; `version` is greater than every earlier one (a
  // receiver checks with last_version() first, and drops older ones with NoteIgnored).
  void Deliver(int64_t version, WeightBuffer weights, absl::Duration transfer);
  // Every later TakeNewer / WaitNewer returns `status` (a permanent error, e.g. a mismatch).
  void Fail(absl::Status status);
  // Wakes waiters and sleepers for good (the subscriber is being destroyed).
  void Close();

  void NoteRetry();
  void NoteReconnect(const absl::Status& why);  // an OK `why` leaves last_error as it is
  // A transient error that is retried (stats().last_error, and WaitNewer's time-out message).
  void NoteError(const absl::Status& why);
  void NoteChecksumFailure(absl::string_view what);
  // A complete version arrived that is not newer than last_version(): dropped, counted.
  void NoteIgnored(int64_t version);

  // Sleeps up to `duration`; false once closed (the receiver thread should return).
  bool SleepUnlessClosed(absl::Duration duration);
  bool closed() const;
  int64_t last_version() const;

  absl::StatusOr<std::optional<VersionedWeights>> TakeNewer(int64_t have) const;
  absl::StatusOr<VersionedWeights> WaitNewer(int64_t have, absl::Duration timeout) const;
  SubscriberStats stats() const;

 private:
  // Retired versions kept for reuse: the engine holds at most the current and, briefly, the
  // previous one, so two spares cover the steady state.
  static constexpr size_t kMaxRetired = 2;

  VersionedWeights Latest() const;  // mu_ held

  const WeightSpec spec_;
  const Device device_;
  mutable std::mutex mu_;
  mutable std::condition_variable changed_;  // a version arrived, a failure, or Close
  WeightBuffer latest_;                      // newest complete version; never written again
  int64_t latest_version_ = -1;
  std::vector<WeightBuffer> retired_;
  absl::Status failure_;
  bool closed_ = false;
  SubscriberStats stats_;
};

}  // namespace prl::weight_broadcast_internal
