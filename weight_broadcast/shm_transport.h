// The same-node weight transport: a named shared-memory segment (Boost.Interprocess, /dev/shm,
// owner-only 0600) holding two slots of one model's fp32 buffer, written with a seqlock
// (protocol in weight_broadcast/shm_layout.h).
//
// The publisher writes the slot that is not the newest, then flips one atomic word to name it;
// subscribers copy the newest slot out and re-check its sequence number, retrying if the
// publisher lapped them. So a subscriber never returns a half-written version, the publisher
// never waits for a subscriber, and nothing can be left locked by a dead process: a publisher
// killed mid-write leaves the previous version readable, and a restarted publisher adopts the
// segment (subscribers keep it open and simply see newer versions).
//
// Each subscriber runs one receiver thread that waits on a futex in the segment, copies a new
// version into a fresh ParameterSet (weight_broadcast/mailbox.h) and exposes it complete.
//
// Segment lifetime: the segment outlives its processes (so that a publisher may restart);
// RemoveShmWeightSegment deletes it at the end of a run.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "weight_broadcast/handshake.h"
#include "weight_broadcast/versioning.h"
#include "weight_broadcast/weight_transport.h"

namespace prl {

namespace weight_broadcast_internal {
class SharedSegment;
class WeightMailbox;
}  // namespace weight_broadcast_internal

class ShmWeightPublisher final : public WeightPublisher {
 public:
  // Creates segment `name` ([A-Za-z0-9._-], 1 to 200 characters) sized for `config`, or adopts
  // an existing one whose publisher died (its model and size must match; its newest version
  // stays published). AlreadyExists while another publisher of it lives.
  static absl::StatusOr<std::unique_ptr<ShmWeightPublisher>> Create(const std::string& name,
                                                                    const WeightSpec& spec);
  ~ShmWeightPublisher() override;  // detaches; the segment and its newest version remain

  absl::Status PublishWeights(int64_t version, const WeightView& weights) override;
  PublisherStats stats() const override;
  // The newest version in the segment (an earlier publisher's, after a restart) or published.
  int64_t newest_version() const override { return versions_.newest(); }
  const std::string& name() const { return name_; }

 private:
  ShmWeightPublisher(std::string name, std::unique_ptr<weight_broadcast_internal::SharedSegment> m);

  std::string name_;
  std::unique_ptr<weight_broadcast_internal::SharedSegment> mapping_;
  WeightHandshake handshake_;
  VersionSequence versions_;
  mutable std::mutex stats_mu_;
  PublisherStats stats_;
};

struct ShmSubscriberOptions {
  Device device = Device::Cpu();  // where received ParameterSets live
  // How long Open waits for the segment to appear (an actor started before the learner).
  absl::Duration open_timeout = absl::ZeroDuration();
};

class ShmWeightSubscriber final : public WeightSubscriber {
 public:
  // Maps segment `name` read-only and starts the receiver thread. A segment of another model
  // (FailedPrecondition naming the field), another layout version, a size that disagrees with
  // its header, or a corrupted header are errors saying so.
  static absl::StatusOr<std::unique_ptr<ShmWeightSubscriber>> Open(
      const std::string& name, const WeightSpec& spec, const ShmSubscriberOptions& options = {});
  ~ShmWeightSubscriber() override;  // stops the receiver (within ~50 ms)

  absl::StatusOr<std::optional<VersionedWeights>> TakeNewer(int64_t have) override;
  absl::StatusOr<VersionedWeights> WaitNewer(int64_t have, absl::Duration timeout) override;
  SubscriberStats stats() const override;

 private:
  ShmWeightSubscriber(std::unique_ptr<weight_broadcast_internal::SharedSegment> m,
                      const WeightSpec& spec, Device device);
  void ReceiveLoop();

  std::unique_ptr<weight_broadcast_internal::SharedSegment> mapping_;
  std::unique_ptr<weight_broadcast_internal::WeightMailbox> mailbox_;
  std::thread receiver_;
};

// Facts about a segment (for operators and tests), read without attaching to it.
struct ShmSegmentInfo {
  std::string name;
  uint32_t layout_version = 0;
  int64_t weight_bytes = 0;
  int64_t segment_bytes = 0;
  std::string model_fingerprint;
  int64_t newest_version = -1;  // -1: nothing published yet
  int32_t publisher_pid = 0;    // 0: no publisher attached
  bool publisher_alive = false;
  bool write_in_progress = false;  // a slot is mid-write (or its writer died mid-write)
};
absl::StatusOr<ShmSegmentInfo> InspectShmWeightSegment(const std::string& name);

// Deletes the segment (processes that have it mapped keep their mapping). NotFound if absent.
absl::Status RemoveShmWeightSegment(const std::string& name);

}  // namespace prl
