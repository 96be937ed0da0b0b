#include "roles/weight_transports.h"

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "roles/learner_rank.h"
#include "weight_broadcast/collective_transport.h"
#include "weight_broadcast/cuda_ipc_transport.h"
#include "weight_broadcast/grpc_transport.h"
#include "weight_broadcast/shm_transport.h"

namespace prl::roles {

using config::WeightTransport;

absl::StatusOr<WeightEndpoint> StartWeightPublisher(const config::RunConfig& config,
                                                    const WeightSpec& spec, Device device) {
  WeightEndpoint e;
  const std::string segment = config.weight_segment();
  switch (config.broadcast.transport) {
    case WeightTransport::kShm: {
      PRL_ASSIGN_OR_RETURN(e.publisher, ShmWeightPublisher::Create(segment, spec));
      e.description = absl::StrCat("shared memory ", segment);
      break;
    }
    case WeightTransport::kGrpc: {
      GrpcPublisherOptions options;
      options.address = config.broadcast.listen;
      options.version_file = config.weight_version_file();
      options.stall_timeout = absl::Seconds(config.broadcast.timeout_s);
      PRL_ASSIGN_OR_RETURN_IN(auto publisher, GrpcWeightPublisher::Start(spec, options),
                              "broadcast.listen");
      e.description = absl::StrCat("gRPC on port ", publisher->port());
      e.publisher = std::move(publisher);
      break;
    }
    case WeightTransport::kCudaIpc: {
      CudaIpcPublisherOptions options;
      options.device = device;
      PRL_ASSIGN_OR_RETURN(e.publisher, CudaIpcWeightPublisher::Create(segment, spec, options));
      e.description = absl::StrCat("CUDA IPC ", segment, " on ", device.ToString());
      break;
    }
    case WeightTransport::kNccl: {
      CollectivePublisherOptions options;
      options.address = config.broadcast.listen;
      options.device = device;
      options.timeout = absl::Seconds(config.broadcast.timeout_s);
      options.keepalive_interval = options.timeout / 6;
      options.member_timeout = options.timeout / 3;
      options.version_file = config.weight_version_file();
      PRL_ASSIGN_OR_RETURN_IN(auto publisher, CollectiveWeightPublisher::Start(spec, options),
                              "broadcast.listen");
      e.description = absl::StrCat(device.is_cuda() ? "an NCCL" : "a Gloo",
                                   " broadcast group, store on port ", publisher->port());
      e.publisher = std::move(publisher);
      break;
    }
  }
  return e;
}

absl::StatusOr<std::unique_ptr<WeightSubscriber>> OpenWeightSubscriber(
    const config::RunConfig& config, const WeightSpec& spec, Device device) {
  std::unique_ptr<WeightSubscriber> s;
  // The learner may start after the actor.
  const absl::Duration open_timeout = absl::Seconds(60);
  switch (config.broadcast.transport) {
    case WeightTransport::kShm: {
      ShmSubscriberOptions options;
      options.device = device;
      options.open_timeout = open_timeout;
      PRL_ASSIGN_OR_RETURN(s, ShmWeightSubscriber::Open(config.weight_segment(), spec, options));
      break;
    }
    case WeightTransport::kGrpc: {
      GrpcSubscriberOptions options;
      options.device = device;
      PRL_ASSIGN_OR_RETURN(s,
                           GrpcWeightSubscriber::Connect(config.weights_address(), spec, options));
      break;
    }
    case WeightTransport::kCudaIpc: {
      CudaIpcSubscriberOptions options;
      options.device = device;
      options.open_timeout = open_timeout;
      PRL_ASSIGN_OR_RETURN(s,
                           CudaIpcWeightSubscriber::Open(config.weight_segment(), spec, options));
      break;
    }
    case WeightTransport::kNccl: {
      CollectiveSubscriberOptions options;
      options.device = device;  // the publisher's kind of device too (ValidateRunConfig)
      options.timeout = absl::Seconds(config.broadcast.timeout_s);
      PRL_ASSIGN_OR_RETURN(
          s, CollectiveWeightSubscriber::Connect(config.weights_address(), spec, options));
      break;
    }
  }
  return s;
}

absl::StatusOr<WeightSpec> RunWeightSpec(const config::RunConfig& config,
                                         const ModelConfig& model) {
  PRL_ASSIGN_OR_RETURN(const std::optional<LoraConfig> adapter, AdapterSettings(config.learner));
  if (!adapter.has_value()) return WeightSpec(model);
  return WeightSpec(model, *adapter);
}

void RemoveWeightTransportState(const config::RunConfig& config) {
  if (config.broadcast.transport == WeightTransport::kShm) {
    RemoveShmWeightSegment(config.weight_segment()).IgnoreError();
  } else if (config.broadcast.transport == WeightTransport::kCudaIpc) {
    RemoveCudaIpcWeightSegment(config.weight_segment()).IgnoreError();
  }
}

}  // namespace prl::roles
