#include "core/buffer.h"

#include <cstdlib>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/cuda_runtime.h"
#include "core/status_macros.h"

namespace prl {

namespace {
constexpr size_t kCpuAlignment = 64;
constexpr size_t kMaxCpuBytes = size_t{1} << 48;
}

absl::StatusOr<Buffer> Buffer::Allocate(Device device, size_t bytes) {
  Buffer buffer;
  buffer.device_ = device;
  if (bytes == 0) return buffer;
  if (device.is_cpu()) {
    // More than any host's address space (2^48 bytes): refused before the allocator sees it
    // (whose rounding would overflow near SIZE_MAX, and which ASan aborts on past 2^40).
    if (bytes > kMaxCpuBytes) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "allocating ", bytes, " bytes of host memory: more than the ", kMaxCpuBytes,
          " bytes an address space holds"));
    }
    const size_t rounded = (bytes + kCpuAlignment - 1) / kCpuAlignment * kCpuAlignment;
    buffer.data_ = std::aligned_alloc(kCpuAlignment, rounded);
    if (buffer.data_ == nullptr) {
      return absl::ResourceExhaustedError(
          absl::StrCat("allocating ", bytes, " bytes of host memory failed"));
    }
  } else {
    PRL_ASSIGN_OR_RETURN(buffer.data_, cuda::Malloc(device.index, bytes));
  }
  buffer.bytes_ = bytes;
  return buffer;
}

absl::StatusOr<Buffer> Buffer::AllocateZeroed(Device device, size_t bytes) {
  PRL_ASSIGN_OR_RETURN(Buffer buffer, Allocate(device, bytes));
  PRL_RETURN_IF_ERROR(buffer.Zero());
  return buffer;
}

Buffer::Buffer(Buffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)),
      device_(other.device_) {}

Buffer& Buffer::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    Release();
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    device_ = other.device_;
  }
  return *this;
}

Buffer::~Buffer() { Release(); }

void Buffer::Release() {
  if (data_ == nullptr) return;
  if (device_.is_cpu()) {
    std::free(data_);
  } else {
    cuda::Free(device_.index, data_);
  }
  data_ = nullptr;
  bytes_ = 0;
}

absl::Status Buffer::Zero() {
  if (bytes_ == 0) return absl::OkStatus();
  if (device_.is_cpu()) {
    std::memset(data_, 0, bytes_);
    return absl::OkStatus();
  }
  // bytes_ may not be a multiple of 4; fill whole floats then copy the tail from the host.
  const size_t floats = bytes_ / 4;
  PRL_RETURN_IF_ERROR(cuda::FillF32(device_.index, static_cast<float*>(data_), floats, 0.0f));
  if (bytes_ % 4 != 0) {
    const char zeros[4] = {0, 0, 0, 0};
    PRL_RETURN_IF_ERROR(cuda::Memcpy(static_cast<char*>(data_) + floats * 4, zeros, bytes_ % 4));
  }
  return absl::OkStatus();
}

absl::Status CopyBytes(void* dst, Device dst_device, const void* src, Device src_device,
                       size_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  if (dst_device.is_cpu() && src_device.is_cpu()) {
    std::memcpy(dst, src, bytes);
    return absl::OkStatus();
  }
  return cuda::Memcpy(dst, src, bytes);
}

}  // namespace prl
