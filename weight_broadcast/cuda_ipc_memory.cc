// The CUDA runtime side of cuda_ipc_memory.h.
#include "weight_broadcast/cuda_ipc_memory.h"

#include <cuda_runtime.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/cuda/cuda_check.h"

namespace prl::weight_broadcast_internal {

static_assert(sizeof(cudaIpcMemHandle_t) == kIpcHandleBytes);

bool CudaIpcCompiled() { return true; }

absl::StatusOr<std::unique_ptr<ExportedBuffer>> ExportedBuffer::Allocate(Device device,
                                                                         size_t bytes) {
  PRL_CUDA_RETURN_IF_ERROR(cudaSetDevice(device.index));
  void* data = nullptr;
  if (const cudaError_t e = cudaMalloc(&data, bytes == 0 ? 1 : bytes); e != cudaSuccess) {
    cudaGetLastError();  // out of memory is not sticky: clear it
    return absl::ResourceExhaustedError(absl::StrCat("cuda_ipc: cudaMalloc of ", bytes,
                                                     " bytes on ", device.ToString(),
                                                     " failed: ", cudaGetErrorString(e)));
  }
  cudaIpcMemHandle_t handle;
  if (absl::Status s = PRL_CUDA_STATUS(cudaIpcGetMemHandle(&handle, data)); !s.ok()) {
    cudaFree(data);
    return s;
  }
  IpcHandle bytes_of_handle;
  std::memcpy(bytes_of_handle.data(), &handle, kIpcHandleBytes);
  return std::unique_ptr<ExportedBuffer>(new ExportedBuffer(device, data, bytes_of_handle));
}

ExportedBuffer::~ExportedBuffer() {
  cudaSetDevice(device_.index);
  cudaFree(data_);
}

absl::StatusOr<std::unique_ptr<ImportedBuffer>> ImportedBuffer::Open(const IpcHandle& handle,
                                                                     Device device) {
  PRL_CUDA_RETURN_IF_ERROR(cudaSetDevice(device.index));
  cudaIpcMemHandle_t h;
  std::memcpy(&h, handle.data(), kIpcHandleBytes);
  void* data = nullptr;
  if (const cudaError_t e = cudaIpcOpenMemHandle(&data, h, cudaIpcMemLazyEnablePeerAccess);
      e != cudaSuccess) {
    cudaGetLastError();  // a stale handle is not sticky: clear it
    return absl::UnavailableError(absl::StrCat(
        "cuda_ipc: cudaIpcOpenMemHandle on ", device.ToString(), " failed: ", cudaGetErrorString(e),
        " (the publisher exited, or its GPU cannot be reached from this one)"));
  }
  return std::unique_ptr<ImportedBuffer>(new ImportedBuffer(device, data, handle));
}

ImportedBuffer::~ImportedBuffer() {
  cudaSetDevice(device_.index);
  cudaIpcCloseMemHandle(data_);
}

}  // namespace prl::weight_broadcast_internal
