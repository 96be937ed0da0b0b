// The thin layer between prl and the CUDA runtime: device discovery, device memory, copies.
//
// Compiled against the CUDA runtime when PRL_CUDA is on; otherwise every function reports
// that CUDA is absent (cuda_runtime_none.cc), so callers need no #ifdefs. Errors name the
// failing CUDA call, file and line.
#pragma once

#include <cstddef>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace prl::cuda {

// Built with the CUDA runtime.
bool Compiled();
// Built with the CUDA backend of the kernels (kernels/cuda/: GEMMs, norms, RoPE, SwiGLU,
// embedding, attention, LM head, optimizer, and the engine's paged KV cache and sampler).
bool KernelsCompiled();
// Usable GPUs; 0 without CUDA, without a driver, or without a GPU. Never fails.
int DeviceCount();
// The GPU's product name as the driver reports it (cudaGetDeviceProperties), e.g.
// "NVIDIA H100 80GB HBM3"; for benchmark reports and their peak-FLOP/s table.
absl::StatusOr<std::string> DeviceName(int device);
// The GPU's memory as the driver reports it (cudaMemGetInfo): what is free now and the total.
struct DeviceMemory {
  size_t free_bytes = 0, total_bytes = 0;
};
absl::StatusOr<DeviceMemory> MemoryInfo(int device);

// Device memory through the caching allocator (core/cuda/caching_allocator.h: blocks are
// reused, not returned to the driver; Free first synchronises the calling thread's current
// stream for `device`; out of memory is RESOURCE_EXHAUSTED naming the size).
absl::StatusOr<void*> Malloc(int device, size_t bytes);
void Free(int device, void* ptr);
// Copies between host and device or device and device (cudaMemcpyDefault), synchronously.
absl::Status Memcpy(void* dst, const void* src, size_t bytes);
// Waits until every kernel and copy on `device` has finished (for timing).
absl::Status Synchronize(int device);
// Fills `n` fp32 values at `dst` on `device` with `value` (used to poison outputs in tests).
absl::Status FillF32(int device, float* dst, size_t n, float value);

// Blocks the calling thread until the work it queued on its current stream for `device`
// (core/cuda/stream.h) has finished: the other thread that reads its results may go on.
absl::Status SynchronizeCurrentStream(int device);
// Copies `bytes` (host<->device or device<->device) on the calling thread's current stream for
// `device`, after the work queued there, and waits for it: ordered with the kernels of a
// non-blocking current stream, which cuda::Memcpy (the legacy stream) is not.
absl::Status MemcpyOnCurrentStream(int device, void* dst, const void* src, size_t bytes);
// rows rows of width_bytes each, from src (a row every src_pitch bytes) to dst (every
// dst_pitch bytes), on the current stream, waited for (cudaMemcpy2DAsync).
absl::Status Memcpy2DOnCurrentStream(int device, void* dst, size_t dst_pitch, const void* src,
                                     size_t src_pitch, size_t width_bytes, size_t rows);

// cudaProfilerStart / cudaProfilerStop: the range a profiler started with
// `--profile-from-start off` (ncu, nsys) records.
absl::Status ProfilerStart();
absl::Status ProfilerStop();

// The work queued so far on the calling thread's current stream for `device`, as an event
// another thread can wait for (FSDP's communication thread waits, before an all-gather
// overwrites a unit buffer or a reduce-scatter reads a gradient, for the compute kernels that
// were queued on them). Move-only; an empty marker (default) is already done.
class StreamMarker {
 public:
  StreamMarker() = default;
  static absl::StatusOr<StreamMarker> Record(int device);
  StreamMarker(StreamMarker&& other) noexcept : event_(other.event_) { other.event_ = nullptr; }
  StreamMarker& operator=(StreamMarker&& other) noexcept;
  StreamMarker(const StreamMarker&) = delete;
  StreamMarker& operator=(const StreamMarker&) = delete;
  ~StreamMarker();
  // Blocks the calling host thread until the marked work is done.
  absl::Status Wait() const;

 private:
  void* event_ = nullptr;  // cudaEvent_t
};

}  // namespace prl::cuda
