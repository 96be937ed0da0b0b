// StepTransfer: the host <-> device traffic of one engine step, queued on the calling thread's
// current stream (core/cuda/stream.h) so that it is ordered with the step's kernels and never
// blocks between them. On CUDA the host side goes through a pinned staging buffer (a
// cudaMemcpyAsync from pageable memory would synchronise the stream first); on the CPU the
// copies are plain memcpys.
//
// Usage per step: ToDevice(...) for every input, launch the kernels, ToHost(...) for the
// results, then Finish() — after which the host results are valid and the staging buffer may be
// reused. Not thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "core/device.h"
#include "core/tensor.h"

namespace prl {

class StepTransfer {
 public:
  explicit StepTransfer(Device device) : device_(device) {}
  ~StepTransfer();
  StepTransfer(const StepTransfer&) = delete;
  StepTransfer& operator=(const StepTransfer&) = delete;

  // dst (on the device) = bytes from host memory `src`.
  absl::Status ToDevice(const Tensor& dst, const void* src, size_t bytes);
  // rows x row_bytes from host src (packed) into dst rows of pitch dst_pitch_bytes.
  absl::Status ToDevice2D(const Tensor& dst, size_t dst_pitch_bytes, const void* src,
                          size_t row_bytes, size_t rows);
  // Queues host dst = bytes of the device tensor src; valid after Finish().
  absl::Status ToHost(void* dst, const Tensor& src, size_t bytes);
  // Waits for everything queued on the current stream, then completes the host copies.
  absl::Status Finish();

 private:
  // Room for `bytes` more in the staging buffer (grown only when nothing is in flight).
  absl::StatusOr<char*> Stage(size_t bytes);

  struct PendingHostCopy {
    void* dst;
    size_t offset;  // in the staging buffer
    size_t bytes;
  };
  Device device_;
  char* pinned_ = nullptr;  // CUDA: cudaMallocHost
  size_t capacity_ = 0, used_ = 0;
  std::vector<PendingHostCopy> pending_;
};

}  // namespace prl
