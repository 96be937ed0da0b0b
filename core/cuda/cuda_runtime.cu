// CUDA runtime layer (see core/cuda_runtime.h).
#include <cuda_profiler_api.h>

#include <utility>

#include "core/cuda/caching_allocator.h"
#include "core/cuda/cuda_check.h"
#include "core/cuda/stream.h"
#include "core/cuda_runtime.h"

namespace prl::cuda {

bool Compiled() { return true; }

bool KernelsCompiled() {
#ifdef PRL_CUDA_KERNELS
  return true;
#else
  return false;
#endif
}

int DeviceCount() {
  int count = 0;
  // No driver or no GPU is a normal situation (CI, laptops): report zero devices.
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky error so later calls are not poisoned
    return 0;
  }
  return count;
}

absl::StatusOr<std::string> DeviceName(int device) {
  cudaDeviceProp prop;
  PRL_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, device));
  return std::string(prop.name);
}

absl::StatusOr<DeviceMemory> MemoryInfo(int device) {
  PRL_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  DeviceMemory m;
  PRL_CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&m.free_bytes, &m.total_bytes));
  return m;
}

absl::StatusOr<void*> Malloc(int device, size_t bytes) {
  return CachingMalloc(device, bytes == 0 ? 1 : bytes);
}

void Free(int device, void* ptr) { CachingFree(device, ptr); }

absl::Status Memcpy(void* dst, const void* src, size_t bytes) {
  PRL_CUDA_RETURN_IF_ERROR(cudaMemcpy(dst, src, bytes, cudaMemcpyDefault));
  // cudaMemcpy returns before a device-to-device copy (and the last DMA of one from pageable
  // memory) has landed; the promise here is that it has, so a reader on any stream sees it.
  PRL_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(cudaStreamLegacy));
  return absl::OkStatus();
}

absl::Status Synchronize(int device) {
  PRL_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  PRL_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
  return absl::OkStatus();
}

namespace {
__global__ void FillF32Kernel(float* dst, size_t n, float value) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    dst[i] = value;
  }
}
}  // namespace

absl::Status FillF32(int device, float* dst, size_t n, float value) {
  if (n == 0) return absl::OkStatus();
  PRL_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  const int threads = 256;
  const size_t wanted_blocks = (n + threads - 1) / threads;
  const int blocks = static_cast<int>(wanted_blocks < 4096 ? wanted_blocks : 4096);
  FillF32Kernel<<<blocks, threads>>>(dst, n, value);
  PRL_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  PRL_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
  return absl::OkStatus();
}

absl::Status ProfilerStart() {
  PRL_CUDA_RETURN_IF_ERROR(cudaProfilerStart());
  return absl::OkStatus();
}

absl::Status ProfilerStop() {
  PRL_CUDA_RETURN_IF_ERROR(cudaProfilerStop());
  return absl::OkStatus();
}

absl::Status SynchronizeCurrentStream(int device) {
  PRL_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(CurrentStream(device)));
  return absl::OkStatus();
}

absl::Status MemcpyOnCurrentStream(int device, void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  const cudaStream_t stream = CurrentStream(device);
  PRL_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream));
  PRL_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  return absl::OkStatus();
}

absl::Status Memcpy2DOnCurrentStream(int device, void* dst, size_t dst_pitch, const void* src,
                                     size_t src_pitch, size_t width_bytes, size_t rows) {
  if (width_bytes == 0 || rows == 0) return absl::OkStatus();
  const cudaStream_t stream = CurrentStream(device);
  PRL_CUDA_RETURN_IF_ERROR(cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, width_bytes, rows,
                                             cudaMemcpyDefault, stream));
  PRL_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  return absl::OkStatus();
}

absl::StatusOr<StreamMarker> StreamMarker::Record(int device) {
  PRL_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  cudaEvent_t event = nullptr;
  PRL_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  StreamMarker marker;
  marker.event_ = event;  // owned from here: destroyed even if the record fails
  PRL_CUDA_RETURN_IF_ERROR(cudaEventRecord(event, CurrentStream(device)));
  return marker;
}

StreamMarker& StreamMarker::operator=(StreamMarker&& other) noexcept {
  std::swap(event_, other.event_);
  return *this;
}

StreamMarker::~StreamMarker() {
  if (event_ != nullptr) cudaEventDestroy(static_cast<cudaEvent_t>(event_));
}

absl::Status StreamMarker::Wait() const {
  if (event_ == nullptr) return absl::OkStatus();
  PRL_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(static_cast<cudaEvent_t>(event_)));
  return absl::OkStatus();
}

}  // namespace prl::cuda
