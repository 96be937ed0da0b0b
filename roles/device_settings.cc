#include "roles/device_settings.h"

#include <cstdlib>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "core/cuda_runtime.h"
#include "core/status_macros.h"

namespace prl::roles {

namespace {

absl::StatusOr<Device> RoleDevice(DeviceType type, absl::string_view key, int index) {
  if (type == DeviceType::kCpu) return Device::Cpu();
  return ResolveDevice(absl::StrCat("cuda:", index), key);
}

}  // namespace

absl::StatusOr<EngineOptions> ActorEngineOptions(const config::ActorsSection& a) {
  EngineOptions o;
  PRL_ASSIGN_OR_RETURN(o.device, RoleDevice(a.device, "actors.device", 0));
  o.dtype = a.dtype;
  o.block_size = a.block_size;
  o.max_num_seqs = a.max_num_seqs;
  o.max_num_batched_tokens = a.max_num_batched_tokens;
  o.enable_prefix_caching = a.enable_prefix_caching;
  o.batch_invariant = a.batch_invariant;
  o.cuda_graphs = a.cuda_graphs;
  o.double_buffered_weights = a.double_buffered_weights;
  o.tuned_kernels = a.tuned_kernels;
  o.norm_in_gemm = a.norm_in_gemm;
  o.cuda_lora = a.cuda_lora;
  o.kv_cache_bytes = a.kv_cache_mb << 20;
  if (o.device.is_cuda()) {
    PRL_ASSIGN_OR_RETURN(const cuda::DeviceMemory memory, cuda::MemoryInfo(o.device.index));
    o.kv_cache_bytes =
        static_cast<int64_t>(a.gpu_memory_fraction * static_cast<double>(memory.total_bytes));
    if (static_cast<size_t>(o.kv_cache_bytes) >= memory.free_bytes) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "actors.gpu_memory_fraction = ", a.gpu_memory_fraction, ": the KV cache would take ",
          o.kv_cache_bytes >> 20, " MiB but only ", memory.free_bytes >> 20, " MiB of GPU ",
          o.device.index, " are free; lower it"));
    }
  }
  PRL_RETURN_IF_ERROR(ValidateEngineOptions(o));
  return o;
}

absl::StatusOr<int> LocalRank(int rank) {
  int index = rank;
  if (const char* local = std::getenv("LOCAL_RANK"); local != nullptr) {
    if (!absl::SimpleAtoi(local, &index) || index < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("LOCAL_RANK: expected an integer >= 0, found '", local, "'"));
    }
  }
  return index;
}

absl::StatusOr<Device> LearnerRankDevice(const config::LearnerSection& learner, int rank) {
  PRL_ASSIGN_OR_RETURN(const int index, LocalRank(rank));
  if (learner.device == DeviceType::kCpu) return Device::Cpu();
  const int count = CudaDeviceCount();
  if (index >= count && count > 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("learner.device = cuda: rank ", rank, " needs GPU ", index, " but ", count,
                     " are visible (NCCL runs one rank per GPU: lower learner.world_size)"));
  }
  return RoleDevice(learner.device, "learner.device", index);
}

absl::Status CheckRoleDevices(const config::RunConfig& config) {
  PRL_RETURN_IF_ERROR(RoleDevice(config.learner.device, "learner.device", 0).status());
  return RoleDevice(config.actors.device, "actors.device", 0).status();
}

}  // namespace prl::roles
