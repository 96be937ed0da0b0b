// The server side of the gRPC weight transport (weight_broadcast/grpc_transport.h), in two
// parts: a channel is one sequence of versions (the run's weights, or in a run of adapters one
// adapter's: docs/tenants.md), and the WeightService dispatches each Subscribe stream to the
// channel its request names (SubscribeRequest.adapter_id; empty: the run's weights).
//
// GrpcWeightChannel: Publish copies the weights into an immutable snapshot and checksums it
// (XXH3-64), then returns; each stream sends the newest snapshot newer than what its subscriber
// has, as chunks, and then waits for the next. A stream finishes the version it is sending
// before it looks again, so a slow subscriber skips the versions published meanwhile instead of
// queueing them (snapshots are shared, never copied per stream); one still sending a version two
// or more behind the newest after stall_timeout is cut (it reconnects and gets the newest).
//
// GrpcWeightService: a channel not added yet answers UNAVAILABLE (a learner that has not heard
// of the adapter yet: the subscriber retries), a removed one NOT_FOUND (a deleted adapter: the
// subscriber gives up). Thread-safety: every method from any thread.
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "prl/v1/weights.grpc.pb.h"
#include "weight_broadcast/handshake.h"
#include "weight_broadcast/versioning.h"
#include "weight_broadcast/weight_transport.h"

namespace prl {
struct GrpcPublisherOptions;
}

namespace prl::weight_broadcast_internal {

class GrpcWeightChannel {
 public:
  // `version_file`: where the newest published version is kept (empty: not kept).
  GrpcWeightChannel(const WeightSpec& spec, const GrpcPublisherOptions& options,
                    std::string version_file);

  // What an earlier publisher of the channel made visible (its version file).
  absl::Status LoadHeldVersion();
  // One subscriber's stream, until it cancels or the channel stops.
  grpc::Status Stream(grpc::ServerContext* context, const v1::SubscribeRequest& request,
                      grpc::ServerWriter<v1::WeightChunk>* writer);
  absl::Status Publish(int64_t version, const WeightView& weights);
  // Ends every stream with `why` (UNAVAILABLE: the subscriber reconnects; NOT_FOUND: it stops).
  void Stop(grpc::Status why);

  PublisherStats stats() const;
  int64_t newest_version() const { return versions_.newest(); }
  void CorruptNextChunk() { corrupt_next_.store(true); }

 private:
  struct Snapshot;
  struct Transfer {
    int64_t index = 0;  // the snapshot's
    absl::Time since;
    bool cut = false;
  };

  void AddSubscribers(int64_t delta);
  // Records which snapshot (by index; -1: none) a stream is sending since when.
  void Sending(grpc::ServerContext* context, int64_t index);
  // Cancels the streams that have been sending a snapshot older than the previous one for
  // longer than stall_timeout_: only they can pin a snapshot that is neither latest_ nor
  // retired_.
  void CutStalledStreamsLocked();
  // Why a stream ends early: the channel stops (stop_status_), or the subscriber cancelled.
  grpc::Status EndOfStream();
  // The newest snapshot newer than `have`; nullptr on stop or when the client is gone.
  std::shared_ptr<const Snapshot> WaitNewer(int64_t have, grpc::ServerContext* context);
  bool Send(const Snapshot& s, grpc::ServerContext* context,
            grpc::ServerWriter<v1::WeightChunk>* writer);
  bool stopping();

  const WeightHandshake handshake_;
  const std::string config_json_;
  const int64_t weight_bytes_;
  const int64_t chunk_bytes_;
  const absl::Duration stall_timeout_;
  const std::string version_file_;
  std::atomic<bool> corrupt_next_{false};
  VersionSequence versions_;  // published, and reported by subscribers (their have_version)
  mutable std::mutex mu_;
  std::condition_variable changed_;  // a new snapshot, or stopping
  std::shared_ptr<Snapshot> latest_;
  std::shared_ptr<Snapshot> retired_;  // the previous latest_, kept for its memory
  std::map<grpc::ServerContext*, Transfer> sending_;  // streams sending now
  int64_t published_ = 0;
  bool stopping_ = false;
  grpc::Status stop_status_;
  PublisherStats stats_;
};

class GrpcWeightService final : public v1::WeightService::Service {
 public:
  grpc::Status Subscribe(grpc::ServerContext* context, const v1::SubscribeRequest* request,
                         grpc::ServerWriter<v1::WeightChunk>* writer) override;

  // Serves `channel` as `adapter_id`'s (empty: the run's weights), in place of any earlier one.
  void Add(const std::string& adapter_id, std::shared_ptr<GrpcWeightChannel> channel);
  // Stops serving `channel` (if it is still adapter_id's): its streams end with UNAVAILABLE and
  // their subscribers wait for the next channel of the adapter.
  void Detach(const std::string& adapter_id, const GrpcWeightChannel* channel);
  // The adapter was deleted: its streams end with NOT_FOUND, and so do later subscriptions.
  void Remove(const std::string& adapter_id);
  // Ends every stream with UNAVAILABLE (the server shuts down).
  void StopAll();

 private:
  std::mutex mu_;
  std::map<std::string, std::shared_ptr<GrpcWeightChannel>> channels_;
  std::set<std::string> removed_;
  bool stopped_ = false;
};

// Starts a server of `service` on options.address (keepalive set for idle streams).
absl::StatusOr<std::unique_ptr<grpc::Server>> StartWeightServer(GrpcWeightService* service,
                                                                const GrpcPublisherOptions& options,
                                                                int* port);

}  // namespace prl::weight_broadcast_internal
