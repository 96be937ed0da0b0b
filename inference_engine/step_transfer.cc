#include "inference_engine/step_transfer.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#if PRL_WITH_CUDA
#include <cuda_runtime.h>

#include "core/cuda/cuda_check.h"
#include "core/cuda/stream.h"
#endif

namespace prl {

StepTransfer::~StepTransfer() {
#if PRL_WITH_CUDA
  if (pinned_ != nullptr) {
    (void)cudaStreamSynchronize(cuda::CurrentStream(device_.index));
    cudaFreeHost(pinned_);
  }
#endif
}

absl::StatusOr<char*> StepTransfer::Stage(size_t bytes) {
#if PRL_WITH_CUDA
  const size_t aligned = (bytes + 63) / 64 * 64;
  if (used_ + aligned > capacity_) {
    if (used_ > 0) {
      // Copies into the old buffer may still be queued: finish them first.
      PRL_RETURN_IF_ERROR(Finish());
    }
    if (pinned_ != nullptr) cudaFreeHost(pinned_);
    pinned_ = nullptr;
    capacity_ = std::max<size_t>({aligned, 2 * capacity_, size_t{1} << 20});
    void* p = nullptr;
    PRL_RETURN_IF_ERROR(PRL_CUDA_STATUS(cudaMallocHost(&p, capacity_)));
    pinned_ = static_cast<char*>(p);
  }
  char* out = pinned_ + used_;
  used_ += aligned;
  return out;
#else
  (void)bytes;
  return absl::InternalError("engine step transfer: built without CUDA");
#endif
}

absl::Status StepTransfer::ToDevice(const Tensor& dst, const void* src, size_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  if (dst.device.is_cpu()) {
    std::memcpy(dst.data, src, bytes);
    return absl::OkStatus();
  }
#if PRL_WITH_CUDA
  PRL_ASSIGN_OR_RETURN(char* staged, Stage(bytes));
  std::memcpy(staged, src, bytes);
  return PRL_CUDA_STATUS(cudaMemcpyAsync(dst.data, staged, bytes, cudaMemcpyHostToDevice,
                                         cuda::CurrentStream(device_.index)));
#else
  return absl::InternalError("engine step transfer: built without CUDA");
#endif
}

absl::Status StepTransfer::ToDevice2D(const Tensor& dst, size_t dst_pitch_bytes, const void* src,
                                      size_t row_bytes, size_t rows) {
  if (row_bytes == 0 || rows == 0) return absl::OkStatus();
  if (dst.device.is_cpu()) {
    for (size_t r = 0; r < rows; ++r) {
      std::memcpy(static_cast<char*>(dst.data) + r * dst_pitch_bytes,
                  static_cast<const char*>(src) + r * row_bytes, row_bytes);
    }
    return absl::OkStatus();
  }
#if PRL_WITH_CUDA
  PRL_ASSIGN_OR_RETURN(char* staged, Stage(row_bytes * rows));
  std::memcpy(staged, src, row_bytes * rows);
  return PRL_CUDA_STATUS(cudaMemcpy2DAsync(dst.data, dst_pitch_bytes, staged, row_bytes, row_bytes,
                                           rows, cudaMemcpyHostToDevice,
                                           cuda::CurrentStream(device_.index)));
#else
  return absl::InternalError("engine step transfer: built without CUDA");
#endif
}

absl::Status StepTransfer::ToHost(void* dst, const Tensor& src, size_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  if (src.device.is_cpu()) {
    std::memcpy(dst, src.data, bytes);
    return absl::OkStatus();
  }
#if PRL_WITH_CUDA
  PRL_ASSIGN_OR_RETURN(char* staged, Stage(bytes));
  pending_.push_back({dst, static_cast<size_t>(staged - pinned_), bytes});
  return PRL_CUDA_STATUS(cudaMemcpyAsync(staged, src.data, bytes, cudaMemcpyDeviceToHost,
                                         cuda::CurrentStream(device_.index)));
#else
  return absl::InternalError("engine step transfer: built without CUDA");
#endif
}

absl::Status StepTransfer::Finish() {
  if (device_.is_cpu()) return absl::OkStatus();
#if PRL_WITH_CUDA
  PRL_RETURN_IF_ERROR(PRL_CUDA_STATUS(cudaStreamSynchronize(cuda::CurrentStream(device_.index))));
  for (const PendingHostCopy& c : pending_) std::memcpy(c.dst, pinned_ + c.offset, c.bytes);
#endif
  pending_.clear();
  used_ = 0;
  return absl::OkStatus();
}

}  // namespace prl
