// An owned, device-aware block of memory. Parameters, gradients and activations are plain
// views (Tensor) into a few Buffers, llm.c style, so that one allocation holds a whole model
// and sharding or broadcasting it is a matter of byte ranges.
//
// Invariants: data() is 64-byte aligned on the CPU (AVX-512 loads, cache lines); a Buffer is
// move-only and frees its memory on its own device. Not thread-safe for concurrent
// Allocate/move; concurrent reads and writes of disjoint bytes are the caller's business.
#pragma once

#include <cstddef>

#include "absl/status/statusor.h"
#include "core/device.h"

namespace prl {

class Buffer {
 public:
  Buffer() = default;
  // Allocates `bytes` (uninitialised) on `device`. Zero bytes gives an empty buffer.
  static absl::StatusOr<Buffer> Allocate(Device device, size_t bytes);
  // Same, zero-filled.
  static absl::StatusOr<Buffer> AllocateZeroed(Device device, size_t bytes);

  Buffer(Buffer&& other) noexcept;
  Buffer& operator=(Buffer&& other) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer();

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  Device device() const { return device_; }
  bool empty() const { return bytes_ == 0; }

  absl::Status Zero();

 private:
  void Release();

  void* data_ = nullptr;
  size_t bytes_ = 0;
  Device device_;
};

// Copies `bytes` between any two devices (host<->device, device<->device), synchronously.
absl::Status CopyBytes(void* dst, Device dst_device, const void* src, Device src_device,
                       size_t bytes);

}  // namespace prl
