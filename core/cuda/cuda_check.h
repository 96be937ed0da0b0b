// Checked CUDA calls: every runtime call's error is turned into an absl::Status naming the
// call, the CUDA error string, file and line (llm.c's cudaCheck, as a Status).
#pragma once

#include <cuda_runtime.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace prl::cuda {
inline absl::Status CudaStatus(cudaError_t err, const char* call, const char* file, int line) {
  if (err == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat(call, " failed: ", cudaGetErrorString(err), " (", file, ":", line, ")"));
}
}  // namespace prl::cuda

#define PRL_CUDA_STATUS(call) ::prl::cuda::CudaStatus((call), #call, __FILE__, __LINE__)
#define PRL_CUDA_RETURN_IF_ERROR(call)                       \
  do {                                                       \
    ::absl::Status prl_cuda_status_ = PRL_CUDA_STATUS(call); \
    if (!prl_cuda_status_.ok()) return prl_cuda_status_;     \
  } while (0)
