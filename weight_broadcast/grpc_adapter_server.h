// A run of adapters' weight server across nodes (docs/tenants.md): one WeightService on the
// learner's broadcast.listen serves every adapter's versions, each adapter a channel of its own
// (weight_broadcast/grpc_channel.h) that an actor subscribes to by the adapter's id
// (GrpcSubscriberOptions.adapter_id). The learner adds an adapter's channel when it first hears
// of the adapter (its trainer publishes through the publisher Add returns) and removes it when
// the adapter is deleted; until an adapter is added its subscribers wait (UNAVAILABLE, retried),
// once removed they stop (NOT_FOUND).
//
// Owns: the server and its channels. Thread-safety: every method from any thread.
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "weight_broadcast/grpc_transport.h"
#include "weight_broadcast/weight_transport.h"

namespace prl {

class GrpcAdapterWeightServer {
 public:
  // Serves on options.address; options.version_file is not used (each adapter has its own).
  static absl::StatusOr<std::unique_ptr<GrpcAdapterWeightServer>> Start(
      const GrpcPublisherOptions& options);
  ~GrpcAdapterWeightServer();  // Shutdown()

  // The publisher of `adapter_id`'s versions (`spec`: the model and the adapter's settings),
  // in place of an earlier one of the adapter (a trainer made again); `version_file` keeps its
  // newest version across a learner's restart (empty: not kept). The publisher must not outlive
  // the server; destroying it closes the channel (its subscribers wait for the next one).
  absl::StatusOr<std::unique_ptr<WeightPublisher>> Add(const std::string& adapter_id,
                                                       const WeightSpec& spec,
                                                       const std::string& version_file);
  // The adapter was deleted: its subscribers stop (NOT_FOUND).
  void Remove(const std::string& adapter_id);

  int port() const { return port_; }
  // Ends every stream (subscribers see UNAVAILABLE and reconnect) and stops the server.
  void Shutdown();

 private:
  GrpcAdapterWeightServer() = default;

  GrpcPublisherOptions options_;
  std::unique_ptr<weight_broadcast_internal::GrpcWeightService> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

}  // namespace prl
