#include "core/tensor.h"

#include <cstring>

#include "absl/strings/str_join.h"
#include "core/cuda_runtime.h"
#include "core/status_macros.h"

namespace prl {

Tensor::Tensor(void* data_in, DType dtype_in, Device device_in,
               std::initializer_list<int64_t> shape)
    : data(data_in), dtype(dtype_in), device(device_in) {
  PRL_CHECK(shape.size() <= kMaxRank, "rank ", shape.size(), " exceeds ", kMaxRank);
  for (int64_t d : shape) {
    PRL_CHECK(d >= 0, "negative dimension ", d);
    dims[rank++] = d;
  }
}

int64_t Tensor::numel() const {
  int64_t n = 1;
  for (int i = 0; i < rank; ++i) n *= dims[i];
  return n;
}

Tensor Tensor::Rows(int64_t begin, int64_t end) const {
  PRL_CHECK(rank >= 1 && 0 <= begin && begin <= end && end <= dims[0], "rows [", begin, ", ", end,
            ") of a tensor of shape ", ShapeString());
  Tensor out = *this;
  const int64_t row_elements = dims[0] == 0 ? 0 : numel() / dims[0];
  out.data = static_cast<char*>(data) + begin * row_elements * DTypeSize(dtype);
  out.dims[0] = end - begin;
  return out;
}

Tensor Tensor::Reshape(std::initializer_list<int64_t> shape) const {
  Tensor out(data, dtype, device, shape);
  PRL_CHECK(out.numel() == numel(), "reshape of ", ShapeString(), " to ", out.ShapeString());
  return out;
}

std::string Tensor::ShapeString() const {
  return absl::StrCat("(", absl::StrJoin(dims.begin(), dims.begin() + rank, ", "), ")");
}

bool Tensor::SameShape(const Tensor& other) const {
  if (rank != other.rank) return false;
  for (int i = 0; i < rank; ++i) {
    if (dims[i] != other.dims[i]) return false;
  }
  return true;
}

absl::Status ZeroTensor(const Tensor& dst) {
  if (dst.numel() == 0) return absl::OkStatus();
  if (dst.device.is_cpu()) {
    std::memset(dst.data, 0, dst.bytes());
    return absl::OkStatus();
  }
  PRL_CHECK(dst.bytes() % 4 == 0, "ZeroTensor on a device needs whole 32-bit words");
  return cuda::FillF32(dst.device.index, static_cast<float*>(dst.data), dst.bytes() / 4, 0.0f);
}

absl::Status CopyTensor(const Tensor& dst, const Tensor& src) {
  PRL_CHECK(dst.dtype == src.dtype && dst.numel() == src.numel(), "CopyTensor of ",
            src.ShapeString(), " ", DTypeName(src.dtype), " into ", dst.ShapeString(), " ",
            DTypeName(dst.dtype));
  return CopyBytes(dst.data, dst.device, src.data, src.device, src.bytes());
}

absl::StatusOr<OwnedTensor> AllocateTensor(DType dtype, Device device,
                                           std::initializer_list<int64_t> shape) {
  OwnedTensor owned;
  owned.view = Tensor(nullptr, dtype, device, shape);
  PRL_ASSIGN_OR_RETURN(owned.buffer, Buffer::Allocate(device, owned.view.bytes()));
  owned.view.data = owned.buffer.data();
  return owned;
}

}  // namespace prl
