// CUDA streams and events, and the calling thread's current stream per device.
//
// Every kernel dispatcher launches on CurrentStream(device). By default that is the per-thread
// default stream (cudaStreamPerThread): one per thread and device, created lazily by the
// runtime, so threads do not serialise on one queue. It is a *blocking* stream, which is
// deliberate: core's synchronous copies (cuda::Memcpy, Buffer::Zero) run on the legacy
// default stream, and a blocking stream is ordered with it, so a kernel launched before a copy
// finishes before the copy reads its output and a copy finishes before a later kernel reads
// it. A Stream created here is non-blocking (for overlap, e.g. FSDP's all-gather of the next
// block beside the current block's compute): it is ordered with nothing implicitly, so work
// on it is ordered by Events (Stream::Wait), and it must be synchronised before a synchronous
// copy reads what it wrote.
//
// StreamGuard makes a given stream current for the calling thread and device for a scope.
// Thread-safety: the current stream is thread-local; Stream and Event are move-only handles
// that one thread uses at a time.
//
// PRL_CUDA_CHECK(call) aborts with the call, CUDA's message, file and line (PRL_CHECK
// semantics) for void kernel dispatchers; Status-returning code uses PRL_CUDA_RETURN_IF_ERROR
// (core/cuda/cuda_check.h).
#pragma once

#include <cuda_runtime.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "core/check.h"

namespace prl::cuda {

[[noreturn]] inline void CudaCheckFailed(cudaError_t err, const char* call, const char* file,
                                         int line) {
  ::prl::internal::CheckFailed(
      file, line, call,
      absl::StrCat("failed: ", cudaGetErrorName(err), ": ", cudaGetErrorString(err)));
}

}  // namespace prl::cuda

#define PRL_CUDA_CHECK(call)                                                  \
  do {                                                                        \
    const cudaError_t prl_cuda_err_ = (call);                                 \
    if (prl_cuda_err_ != cudaSuccess) [[unlikely]] {                          \
      ::prl::cuda::CudaCheckFailed(prl_cuda_err_, #call, __FILE__, __LINE__); \
    }                                                                         \
  } while (0)

namespace prl::cuda {

// Devices the current-stream table covers (cuda:0 .. cuda:63).
inline constexpr int kMaxDevices = 64;

// The stream the calling thread's kernels for `device` run on (see the file comment).
cudaStream_t CurrentStream(int device);

// Makes `stream` the calling thread's current stream for `device` until the guard's scope
// ends, then restores the previous one. Guards nest; destroy them in reverse order.
class StreamGuard {
 public:
  StreamGuard(int device, cudaStream_t stream);
  ~StreamGuard();
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

 private:
  int device_;
  bool had_previous_;
  cudaStream_t previous_;
};

class Event;

// An owned non-blocking stream on one device.
class Stream {
 public:
  Stream() = default;
  // priority: 0 is the default; lower numbers are higher priority
  // (cudaDeviceGetStreamPriorityRange).
  static absl::StatusOr<Stream> Create(int device, int priority = 0);
  Stream(Stream&& other) noexcept;
  Stream& operator=(Stream&& other) noexcept;
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  ~Stream();

  cudaStream_t get() const { return stream_; }
  int device() const { return device_; }
  // Blocks the host until everything queued on the stream has finished.
  absl::Status Synchronize() const;
  // Work queued on this stream after the call waits for `event`'s recorded work (no host wait).
  absl::Status Wait(const Event& event) const;

 private:
  void Release();
  int device_ = -1;
  cudaStream_t stream_ = nullptr;
};

// An owned event on one device: a point in a stream's work to wait for, or to time.
class Event {
 public:
  Event() = default;
  // timing = false gives the cheaper cudaEventDisableTiming event (ordering only).
  static absl::StatusOr<Event> Create(int device, bool timing = false);
  Event(Event&& other) noexcept;
  Event& operator=(Event&& other) noexcept;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  ~Event();

  cudaEvent_t get() const { return event_; }
  int device() const { return device_; }
  // Captures the work queued on `stream` so far (a stream of this event's device).
  absl::Status Record(cudaStream_t stream);
  // Blocks the host until the recorded work has finished.
  absl::Status Synchronize() const;
  // True when the recorded work has finished (or nothing was recorded).
  absl::StatusOr<bool> Done() const;
  // Milliseconds of device time from `start` to `end`, both timing events, recorded and done.
  static absl::StatusOr<float> ElapsedMs(const Event& start, const Event& end);

 private:
  void Release();
  int device_ = -1;
  cudaEvent_t event_ = nullptr;
};

}  // namespace prl::cuda
