// The cross-node weight transport: the learner serves WeightService (proto/prl/v1/weights.proto)
// and each actor holds one Subscribe stream open to it.
//
// Publisher: Publish copies the weights into an immutable snapshot and checksums it (XXH3-64),
// then returns; one server thread per subscriber streams the newest snapshot newer than what
// its subscriber has, as chunks of chunk_bytes, and then waits for the next. A stream finishes
// the version it is sending before it looks again, so a subscriber slower than the learner
// skips the versions published meanwhile instead of queueing them (and snapshots are shared,
// never copied per stream). A run of adapters serves every adapter's versions on one server
// instead (weight_broadcast/grpc_adapter_server.h; the channels: grpc_channel.h).
//
// Subscriber: a receiver thread reads the stream into a fresh ParameterSet
// (weight_broadcast/mailbox.h), verifies the checksum and only then exposes the version. A
// broken stream (server restart, network) or a bad chunk is retried with exponential backoff,
// asking for versions newer than the one it has; a model mismatch is permanent (the server's
// FAILED_PRECONDITION names the differing config.json field), and so is a deleted adapter's
// NOT_FOUND (GrpcSubscriberOptions.adapter_id).
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "prl/v1/weights.grpc.pb.h"
#include "weight_broadcast/handshake.h"
#include "weight_broadcast/weight_transport.h"

namespace prl {

namespace weight_broadcast_internal {
class GrpcWeightChannel;
class GrpcWeightService;
class WeightMailbox;
}

struct GrpcPublisherOptions {
  std::string address = "127.0.0.1:50062";  // host:port (loopback by default); port 0: any free
  // Bytes of weights per WeightChunk: large enough that per-message overhead vanishes, small
  // enough that gRPC's default buffers and flow-control windows are not the bottleneck.
  int64_t chunk_bytes = int64_t{4} << 20;
  // Where the newest published version is kept (weight_broadcast/version_file.h), so that a
  // restarted publisher's newest_version() knows it before any subscriber reconnects; empty:
  // not kept.
  std::string version_file = "";
  // A stream still sending a version two or more behind the newest after this long is cut (its
  // subscriber reconnects and gets the newest): a stalled subscriber pins at most the versions
  // published within this time, never an unbounded backlog of snapshots.
  absl::Duration stall_timeout = absl::Seconds(60);
};

class GrpcWeightPublisher final : public WeightPublisher {
 public:
  static absl::StatusOr<std::unique_ptr<GrpcWeightPublisher>> Start(
      const WeightSpec& spec, const GrpcPublisherOptions& options);
  ~GrpcWeightPublisher() override;  // Shutdown()

  absl::Status PublishWeights(int64_t version, const WeightView& weights) override;
  // The newest version published, in the version file, or held by a subscriber that
  // connected (its have_version).
  int64_t newest_version() const override;
  PublisherStats stats() const override;

  int port() const { return port_; }
  // Ends every stream (subscribers see UNAVAILABLE and reconnect) and stops the server.
  void Shutdown();
  // Test hook: flips one byte of the next chunk sent, after the checksum was computed.
  void CorruptNextChunkForTesting();

 private:
  GrpcWeightPublisher() = default;

  std::unique_ptr<weight_broadcast_internal::GrpcWeightService> service_;
  std::shared_ptr<weight_broadcast_internal::GrpcWeightChannel> channel_;  // the run's weights
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

struct GrpcSubscriberOptions {
  Device device = Device::Cpu();  // where received ParameterSets live
  // Largest message accepted: above the publisher's chunk_bytes plus the config.json.
  int64_t max_message_bytes = int64_t{64} << 20;
  // Reconnect backoff: doubles from initial to max after each failed attempt; a received
  // version resets it.
  absl::Duration initial_backoff = absl::Milliseconds(100);
  absl::Duration max_backoff = absl::Seconds(5);
  // A run of adapters: the adapter whose versions to take (its id); empty: the run's weights.
  // A server that does not serve it yet is retried; one that says it was deleted (NOT_FOUND)
  // fails every later TakeNewer / WaitNewer with NotFound.
  std::string adapter_id;
};

class GrpcWeightSubscriber final : public WeightSubscriber {
 public:
  // Starts the receiver thread for `target` (host:port). Does not wait for the server: an
  // unreachable one is retried and shows in stats().last_error and WaitNewer's message.
  static absl::StatusOr<std::unique_ptr<GrpcWeightSubscriber>> Connect(
      const std::string& target, const WeightSpec& spec,
      const GrpcSubscriberOptions& options = {});
  ~GrpcWeightSubscriber() override;  // cancels the stream and joins the receiver

  absl::StatusOr<std::optional<VersionedWeights>> TakeNewer(int64_t have) override;
  absl::StatusOr<VersionedWeights> WaitNewer(int64_t have, absl::Duration timeout) override;
  SubscriberStats stats() const override;

 private:
  struct Receiving;
  GrpcWeightSubscriber(const std::string& target, const WeightSpec& spec,
                       const GrpcSubscriberOptions& options);
  void ReceiveLoop();
  // One stream, until it ends; the status says why it ended.
  absl::Status ReceiveStream();
  absl::Status Accept(const v1::WeightChunk& chunk, Receiving* r);

  const std::string target_;
  const WeightHandshake handshake_;
  const uint64_t weight_bytes_;  // one version
  const GrpcSubscriberOptions options_;
  std::unique_ptr<v1::WeightService::Stub> stub_;
  std::unique_ptr<weight_broadcast_internal::WeightMailbox> mailbox_;
  std::mutex context_mu_;
  grpc::ClientContext* context_ = nullptr;  // the open stream's, for cancellation
  std::thread receiver_;
};

}  // namespace prl
