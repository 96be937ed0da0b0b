// Tensor: a non-owning, row-major, contiguous view (pointer, dtype, device, shape).
//
// Memory is owned by Buffers; a Tensor is cheap to copy and never frees anything. Kernels take
// Tensors, check shapes, dtypes and devices, and dispatch on the device (kernels/dispatch.h).
// Shapes are written as comments at every use, e.g. `Tensor logits;  // (T, V) fp32`.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "core/buffer.h"
#include "core/check.h"
#include "core/device.h"
#include "core/dtype.h"

namespace prl {

struct Tensor {
  static constexpr int kMaxRank = 4;

  void* data = nullptr;
  DType dtype = DType::kF32;
  Device device;
  std::array<int64_t, kMaxRank> dims{};
  int rank = 0;

  Tensor() = default;
  Tensor(void* data, DType dtype, Device device, std::initializer_list<int64_t> shape);

  bool defined() const { return data != nullptr; }
  int64_t size(int dim) const {
    PRL_CHECK(dim >= 0 && dim < rank, "dim ", dim, " of a rank-", rank, " tensor");
    return dims[dim];
  }
  int64_t numel() const;
  size_t bytes() const { return static_cast<size_t>(numel()) * DTypeSize(dtype); }

  float* f32() const {
    PRL_CHECK(dtype == DType::kF32, "expected an F32 tensor, found ", DTypeName(dtype));
    return static_cast<float*>(data);
  }
  int32_t* i32() const {
    PRL_CHECK(dtype == DType::kI32, "expected an I32 tensor, found ", DTypeName(dtype));
    return static_cast<int32_t*>(data);
  }

  // Rows [begin, end) along dim 0, as a view.
  Tensor Rows(int64_t begin, int64_t end) const;
  // The same elements with another shape of equal numel.
  Tensor Reshape(std::initializer_list<int64_t> shape) const;

  std::string ShapeString() const;  // "(2048, 512)"
  bool SameShape(const Tensor& other) const;
};

// dst = 0, on any device.
absl::Status ZeroTensor(const Tensor& dst);
// dst = src: same dtype and element count, any devices.
absl::Status CopyTensor(const Tensor& dst, const Tensor& src);

// A tensor that owns its storage: a Buffer plus a full view of it.
struct OwnedTensor {
  Buffer buffer;
  Tensor view;
};
absl::StatusOr<OwnedTensor> AllocateTensor(DType dtype, Device device,
                                           std::initializer_list<int64_t> shape);

}  // namespace prl
