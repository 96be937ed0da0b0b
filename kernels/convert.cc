#include "kernels/convert.h"

#include <cstring>

#include "kernels/dispatch.h"
#if PRL_WITH_CUDA
#include "kernels/cuda/cuda_ops.h"
#endif

namespace prl::kernels {

void ConvertDType(const Tensor& dst, const Tensor& src) {
  const char* op = "ConvertDType";
  PRL_CHECK(dst.numel() == src.numel(), op, ": ", dst.numel(), " elements from ", src.numel());
  for (const Tensor* t : {&dst, &src}) {
    PRL_CHECK(t->dtype == DType::kF32 || t->dtype == DType::kBF16, op, ": F32 or BF16, found ",
              DTypeName(t->dtype));
  }
  const Device device = internal::CommonDevice(op, {&dst, &src});
  const int64_t n = src.numel();
  if (device.is_cpu()) {
    if (dst.dtype == src.dtype) {
      std::memcpy(dst.data, src.data, src.bytes());
    } else if (src.dtype == DType::kF32) {
      ConvertFromF32(dst.data, DType::kBF16, src.f32(), n);
    } else {
      ConvertToF32(dst.f32(), src.data, DType::kBF16, n);
    }
    return;
  }
#if PRL_WITH_CUDA
  return cuda::Convert(device.index, dst.dtype, dst.data, src.dtype, src.data, n);
#else
  internal::NoBackend(op, device);
#endif
}

}  // namespace prl::kernels
