// The cross-node collective weight transport (the "nccl" transport): the learner's rank 0
// broadcasts every version to the actors over a collective group, NCCL on CUDA devices and
// Gloo on the CPU. The code is written once over collective::Communicator, so that the CPU
// build runs (and tests) exactly what a GPU runs.
//
// Membership. The publisher serves a small rendezvous store (collective::StoreServer over a
// MemoryStore, on `address`); subscribers reach it with GrpcStore, check the publisher's
// handshake there (same model, same data path: both CPU or both CUDA), and announce themselves
// with a heartbeat. A collective group has fixed members, so the group is formed in epochs:
// when the members change (a newcomer, a member that left or stopped beating, a failed
// broadcast) the publisher forms a new epoch (a new group name; the publisher is rank 0, the
// members follow in the order the epoch record lists them) that every live member joins.
// Protocol details: collective_protocol.h.
//
// Publishing never blocks the learner: Publish copies the weights into a snapshot on the
// publisher's device and returns. A broadcaster thread sends the newest snapshot to the current
// epoch, latest wins: versions published while it was busy are skipped (and counted). Every
// broadcast is a 64-byte header (version, byte count, XXH3-64 of the payload) and then the
// payload; an idle group gets a header every keepalive_interval, so that members can tell a
// quiet publisher from a dead one. A subscriber that joins late receives the newest version
// as soon as its first epoch forms.
//
// Failures. Every collective has a time-out. A member that dies turns the publisher's next
// broadcast into an error (at once for a closed connection, at `timeout` for a hung peer): the
// publisher drops that epoch and forms the next one with the members that are still
// announcing, so a dead member never blocks the learner. The survivors are served again once
// the dead member's heartbeat is older than member_timeout (a hung one that still beats is
// given `timeout` to come back). A subscriber whose collective fails
// (the publisher or a peer died), or whose payload fails its checksum, leaves the epoch and
// waits for the next one; the publisher re-sends the newest version to every new epoch. A
// restarted publisher (same address) is a new instance: subscribers run the handshake again
// and report the newest version they hold, which the new publisher's newest_version() returns
// so that the learner numbers above it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "weight_broadcast/weight_transport.h"

namespace prl {

struct CollectivePublisherOptions {
  // Where the rendezvous store is served (host:port; port 0 picks a free one). Loopback by
  // default: across nodes, an address the actors reach (e.g. "0.0.0.0:29600").
  std::string address = "127.0.0.1:0";
  // Where snapshots live: the CPU broadcasts with Gloo, a CUDA device with NCCL (subscribers
  // must then be on CUDA devices too).
  Device device = Device::Cpu();
  // Per collective (one version's payload must fit in it) and per epoch formation.
  absl::Duration timeout = absl::Seconds(30);
  // An idle group hears a header this often; below timeout / 2.
  absl::Duration keepalive_interval = absl::Seconds(5);
  // A subscriber whose heartbeat is older than this is left out of the next epoch.
  absl::Duration member_timeout = absl::Seconds(10);
  // Where the newest published version is kept (weight_broadcast/version_file.h), so that a
  // restarted publisher's newest_version() knows it before any subscriber reports; empty: not
  // kept.
  std::string version_file = "";
};

class CollectiveWeightPublisher final : public WeightPublisher {
 public:
  // Serves the rendezvous store on options.address and starts the broadcaster thread.
  static absl::StatusOr<std::unique_ptr<CollectiveWeightPublisher>> Start(
      const WeightSpec& spec, const CollectivePublisherOptions& options);
  // Tells the current epoch that it ends, stops the broadcaster and the store. May wait for a
  // broadcast or an epoch formation in progress (at most `timeout`).
  ~CollectiveWeightPublisher() override;

  // Copies `weights` (CPU or any CUDA device) into a snapshot and returns; never waits for the
  // broadcaster or a subscriber.
  absl::Status PublishWeights(int64_t version, const WeightView& weights) override;
  // The newest version published, in the version file, or held by a subscriber that
  // announced itself.
  int64_t newest_version() const override;
  PublisherStats stats() const override;
  int port() const;
  // Test hook: the next version goes out with a wrong checksum in its header.
  void CorruptNextChecksumForTesting();

 private:
  class Broadcaster;
  CollectiveWeightPublisher() = default;
  std::unique_ptr<Broadcaster> broadcaster_;
};

struct CollectiveSubscriberOptions {
  // Where received ParameterSets live, and the data path: CPU (Gloo) or a CUDA device (NCCL),
  // as the publisher's.
  Device device = Device::Cpu();
  // Per collective, per epoch join, and how long Connect waits for the publisher's store.
  // Raised to three keepalive intervals of the publisher if it is shorter.
  absl::Duration timeout = absl::Seconds(30);
  // How often this subscriber tells the publisher it lives (below the publisher's
  // member_timeout).
  absl::Duration heartbeat_interval = absl::Seconds(1);
};

class CollectiveWeightSubscriber final : public WeightSubscriber {
 public:
  // Reaches the publisher's store at `address` (host:port; waiting up to options.timeout for
  // it), runs the handshake (a model or data path mismatch is FailedPrecondition naming it),
  // then announces itself and starts receiving in the background.
  static absl::StatusOr<std::unique_ptr<CollectiveWeightSubscriber>> Connect(
      const std::string& address, const WeightSpec& spec,
      const CollectiveSubscriberOptions& options);
  // Stops announcing and receiving; may wait for a collective in progress (within the
  // publisher's keepalive interval while it lives, at most `timeout`).
  ~CollectiveWeightSubscriber() override;

  absl::StatusOr<std::optional<VersionedWeights>> TakeNewer(int64_t have) override;
  absl::StatusOr<VersionedWeights> WaitNewer(int64_t have, absl::Duration timeout) override;
  SubscriberStats stats() const override;

 private:
  class Receiver;
  CollectiveWeightSubscriber() = default;
  std::unique_ptr<Receiver> receiver_;
};

}  // namespace prl
