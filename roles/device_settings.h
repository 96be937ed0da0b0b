// Where each role runs, from its config keys (`actors.device`, `learner.device`, the dtypes,
// `actors.gpu_memory_fraction`). A CUDA setting that this binary or machine cannot honour is
// FailedPrecondition naming the key: a build without CUDA names the build option that enables
// it (-DPRL_CUDA=ON), a machine without a visible GPU says so (core/device.h ResolveDevice).
#pragma once

#include "absl/status/statusor.h"
#include "config/run_config.h"
#include "core/device.h"
#include "inference_engine/engine.h"

namespace prl::roles {

// The actor's engine options: the device (GPU 0 of those CUDA_VISIBLE_DEVICES shows), the
// compute dtype, the KV cache (actors.kv_cache_mb on the CPU; gpu_memory_fraction of the GPU's
// total memory on CUDA) and the scheduler limits.
absl::StatusOr<EngineOptions> ActorEngineOptions(const config::ActorsSection& actors);

// This rank's index on its node: LOCAL_RANK when the launcher set it, else `rank` (one node).
// A LOCAL_RANK that is not an integer >= 0 is an error naming it.
absl::StatusOr<int> LocalRank(int rank);

// Learner rank `rank`'s device: the CPU, or the GPU of index LOCAL_RANK (when the launcher set
// it; else `rank`) among the visible ones. NCCL runs one rank per GPU: a rank beyond the
// machine's GPUs is FailedPrecondition naming both.
absl::StatusOr<Device> LearnerRankDevice(const config::LearnerSection& learner, int rank);

// What prl run checks before it starts anything: every role's device can be had here.
absl::Status CheckRoleDevices(const config::RunConfig& config);

}  // namespace prl::roles
