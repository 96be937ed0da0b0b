// GpuPlan: which GPUs `prl run` gives each process it starts, through CUDA_VISIBLE_DEVICES.
//
//   - The learner (learner.device = cuda) takes the first learner.world_size visible GPUs; its
//     local ranks use one each (LOCAL_RANK).
//   - Actors on CUDA take the GPUs left, round-robin. When none is left (one GPU, say), they
//     share the learner's GPUs, round-robin: then the actors' KV caches on one GPU may take at
//     most kMaxSharedActorFraction of its memory (count x actors.gpu_memory_fraction), leaving
//     the rest to the learner's weights, gradients, optimizer state and activations and to the
//     actors' weights.
//   - Processes on the CPU get an empty CUDA_VISIBLE_DEVICES.
// GPU ids are those the parent sees: CUDA_VISIBLE_DEVICES's list when it is set, else 0..N-1.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "config/run_config.h"

namespace prl::runner {

inline constexpr double kMaxSharedActorFraction = 0.6;

struct GpuPlan {
  std::string learner;              // CUDA_VISIBLE_DEVICES of the learner launcher
  std::vector<std::string> actors;  // per actor
  bool shared = false;              // actors share a GPU with the learner
  std::string description;          // one line for prl run's output; empty when all on CPU
};

// `visible`: the GPU ids this process sees. Errors name the keys and the counts.
absl::StatusOr<GpuPlan> PlanGpus(const config::RunConfig& config,
                                 const std::vector<std::string>& visible);

// The GPU ids this process sees (from CUDA_VISIBLE_DEVICES, else 0..CudaDeviceCount()-1).
std::vector<std::string> VisibleGpus();

}  // namespace prl::runner
