// The same-node GPU weight transport: the learner keeps two device buffers of the weights and
// actors on the same node map them with CUDA IPC handles and copy device to device into a
// ParameterSet on their own GPU.
//
// A small shared-memory control segment (/dev/shm, 0600; layout in cuda_ipc_layout.h) holds
// the model fingerprint, the versions and sequence numbers of the two slots, and the IPC
// handles of the buffers, written with the seqlock of shm_transport: the publisher fills the
// buffer of the slot that is not the newest (the device copy synchronised) and then flips one
// word to name it; a subscriber copies the newest buffer out (synchronised), then re-checks the
// slot's sequence and retries if the publisher lapped it. So a subscriber never returns a
// half-written version and the publisher never waits for a subscriber.
//
// Each subscriber runs one receiver thread that waits on a futex in the segment and copies a
// new version into a fresh ParameterSet (weight_broadcast/mailbox.h), exposing it complete.
//
// Restarts: device memory dies with the process that allocated it, so, unlike shm, a version
// stays readable only while its publisher is attached (subscribers keep the copy they have).
// Every slot names its owner (the publisher's ProcessToken and an attachment count), and a
// restarted publisher adopts the segment as a new owner: its newest_version() is the version
// the segment names, so the learner continues above it, and subscribers drop the old mappings
// and open the new handles. Mappings of a previous owner are never read.
//
// Builds without CUDA compile this transport but Create and Open return Unimplemented; a
// machine without a GPU gets FailedPrecondition.
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
class CudaIpcControl;
class ExportedBuffer;
class WeightMailbox;
}  // namespace weight_broadcast_internal

struct CudaIpcPublisherOptions {
  Device device = Device::Cuda(0);  // where the two published buffers live
  // How long the destructor waits for subscribers still copying before it frees the buffers.
  absl::Duration drain_timeout = absl::Seconds(2);
};

class CudaIpcWeightPublisher final : public WeightPublisher {
 public:
  // Creates control segment `name` ([A-Za-z0-9._-], 1 to 200 characters) for `config` and two
  // device buffers on options.device, or adopts an existing segment whose publisher is gone
  // (its model must match). AlreadyExists while another publisher of it lives.
  static absl::StatusOr<std::unique_ptr<CudaIpcWeightPublisher>> Create(
      const std::string& name, const WeightSpec& spec, const CudaIpcPublisherOptions& options);
  // Detaches (subscribers stop reading), waits up to drain_timeout for copies in progress, then
  // frees the buffers. The segment and its versions' numbers remain.
  ~CudaIpcWeightPublisher() override;

  // Copies `weights` (CPU or any CUDA device) into the buffer of the older slot and publishes
  // it. Returns when the copy has landed.
  absl::Status PublishWeights(int64_t version, const WeightView& weights) override;
  // The newest version published, or held by the segment from an earlier publisher.
  int64_t newest_version() const override { return versions_.newest(); }
  PublisherStats stats() const override;
  const std::string& name() const { return name_; }

 private:
  CudaIpcWeightPublisher(std::string name, const CudaIpcPublisherOptions& options);

  std::string name_;
  CudaIpcPublisherOptions options_;
  WeightHandshake handshake_;
  VersionSequence versions_;
  std::unique_ptr<weight_broadcast_internal::CudaIpcControl> control_;
  std::unique_ptr<weight_broadcast_internal::ExportedBuffer> buffers_[2];
  mutable std::mutex stats_mu_;
  PublisherStats stats_;
};

struct CudaIpcSubscriberOptions {
  Device device = Device::Cuda(0);  // where received ParameterSets live (a CUDA device)
  // How long Open waits for the segment to appear (an actor started before the learner).
  absl::Duration open_timeout = absl::ZeroDuration();
};

class CudaIpcWeightSubscriber final : public WeightSubscriber {
 public:
  // Maps control segment `name` and starts the receiver thread. A segment of another model
  // (FailedPrecondition naming the field), another layout version, a size that disagrees with
  // its header, or a corrupted header are errors saying so.
  static absl::StatusOr<std::unique_ptr<CudaIpcWeightSubscriber>> Open(
      const std::string& name, const WeightSpec& spec, const CudaIpcSubscriberOptions& options);
  ~CudaIpcWeightSubscriber() override;  // stops the receiver (within ~50 ms), closes mappings

  absl::StatusOr<std::optional<VersionedWeights>> TakeNewer(int64_t have) override;
  absl::StatusOr<VersionedWeights> WaitNewer(int64_t have, absl::Duration timeout) override;
  SubscriberStats stats() const override;

 private:
  class Receiver;
  CudaIpcWeightSubscriber() = default;

  std::unique_ptr<weight_broadcast_internal::WeightMailbox> mailbox_;
  std::unique_ptr<Receiver> receiver_;
  std::thread thread_;
};

// Deletes the control segment (processes that have it mapped keep their mapping). NotFound if
// absent.
absl::Status RemoveCudaIpcWeightSegment(const std::string& name);

}  // namespace prl
