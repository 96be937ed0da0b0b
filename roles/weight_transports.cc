#include "roles/weight_transports.h"

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "weight_broadcast/grpc_transport.h"
#include "weight_broadcast/shm_transport.h"

namespace prl::roles {

using config::WeightTransport;

absl::StatusOr<WeightEndpoint> StartWeightPublisher(const config::RunConfig& config,
                                                    const ModelConfig& model, Device device) {
  WeightEndpoint e;
  switch (config.broadcast.transport) {
    case WeightTransport::kShm: {
      const std::string name = config.weight_segment();
      PRL_ASSIGN_OR_RETURN(e.publisher, ShmWeightPublisher::Create(name, model));
      PRL_ASSIGN_OR_RETURN(const ShmSegmentInfo info, InspectShmWeightSegment(name));
      e.newest_version = info.newest_version;
      e.description = absl::StrCat("shared memory ", name);
      return e;
    }
    case WeightTransport::kGrpc: {
      GrpcPublisherOptions options;
      options.address = config.broadcast.listen;
      PRL_ASSIGN_OR_RETURN(auto publisher, GrpcWeightPublisher::Start(model, options));
      e.description = absl::StrCat("gRPC on port ", publisher->port());
      e.publisher = std::move(publisher);
      return e;
    }
    default:
      break;
  }
  (void)device;
  return absl::UnimplementedError(absl::StrCat(
      "broadcast.transport = ", EnumName(config::kWeightTransportNames, config.broadcast.transport),
      ": not available in this build"));
}

absl::StatusOr<std::unique_ptr<WeightSubscriber>> OpenWeightSubscriber(
    const config::RunConfig& config, const ModelConfig& model, Device device) {
  (void)device;
  switch (config.broadcast.transport) {
    case WeightTransport::kShm: {
      ShmSubscriberOptions options;
      options.open_timeout = absl::Seconds(60);  // the learner may start after the actor
      PRL_ASSIGN_OR_RETURN(auto s,
                           ShmWeightSubscriber::Open(config.weight_segment(), model, options));
      return std::unique_ptr<WeightSubscriber>(std::move(s));
    }
    case WeightTransport::kGrpc: {
      PRL_ASSIGN_OR_RETURN(auto s, GrpcWeightSubscriber::Connect(config.weights_address(), model));
      return std::unique_ptr<WeightSubscriber>(std::move(s));
    }
    default:
      break;
  }
  return absl::UnimplementedError(absl::StrCat(
      "broadcast.transport = ", EnumName(config::kWeightTransportNames, config.broadcast.transport),
      ": not available in this build"));
}

void RemoveWeightTransportState(const config::RunConfig& config) {
  if (config.broadcast.transport == WeightTransport::kShm) {
    RemoveShmWeightSegment(config.weight_segment()).IgnoreError();
  }
}

}  // namespace prl::roles
