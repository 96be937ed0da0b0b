// The run's weight transport (`broadcast.transport`, weight_broadcast/): one factory for the
// learner's publisher and one for an actor's subscriber, so that both ends of a run always
// agree on the medium and its address.
//
//   shm       same node: the run's weight segment in /dev/shm
//   grpc      across nodes: the learner serves WeightService on broadcast.listen; actors dial
//             broadcast.address (or the listen address)
//   cuda_ipc  same node, GPUs: a device copy of the weights mapped with CUDA IPC handles
//   nccl      across nodes, GPUs: a broadcast group set up through the learner's store on
//             broadcast.listen (Gloo when the learner runs on the CPU)
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "config/run_config.h"
#include "model/config.h"
#include "weight_broadcast/weight_transport.h"

namespace prl::roles {

struct WeightEndpoint {
  std::unique_ptr<WeightPublisher> publisher;
  std::string description;  // for the learner's start-up line
};

// The learner's (rank 0's) publisher; `device` is the learner's.
absl::StatusOr<WeightEndpoint> StartWeightPublisher(const config::RunConfig& config,
                                                    const WeightSpec& spec, Device device);

// An actor's subscriber; `device` is its engine's, where received weights live (the engine
// swaps in weights on its own device only).
absl::StatusOr<std::unique_ptr<WeightSubscriber>> OpenWeightSubscriber(
    const config::RunConfig& config, const WeightSpec& spec, Device device);

// What the run's versions hold: the model's parameters, or with LoRA (learner.lora_*) the
// adapter alone (its settings: AdapterSettings). Both ends of the transport use it.
absl::StatusOr<WeightSpec> RunWeightSpec(const config::RunConfig& config, const ModelConfig& model);

// Removes what the transport leaves behind on this node (shared-memory segments) at the end
// of a run; a no-op for the network transports.
void RemoveWeightTransportState(const config::RunConfig& config);

}  // namespace prl::roles
