#include "kernels/rmsnorm.h"

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/dispatch.h"

namespace prl::kernels {

using internal::ExpectTensor;

void RmsNormForward(const Tensor& y, const Tensor& rstd, const Tensor& x, const Tensor& w,
                    float eps) {
  const char* op = "RmsNormForward";
  const int64_t T = x.size(0), C = x.size(1);
  ExpectTensor(op, "y", y, DType::kF32, {T, C});
  ExpectTensor(op, "rstd", rstd, DType::kF32, {T});
  ExpectTensor(op, "w", w, DType::kF32, {C});
  const Device device = internal::CommonDevice(op, {&y, &rstd, &x, &w});
  if (device.is_cpu()) return cpu::RmsNormForward(y.f32(), rstd.f32(), x.f32(), w.f32(), T, C, eps);
  internal::NoBackend(op, device);
}

void RmsNormBackward(const Tensor& dx, const Tensor& dw, const Tensor& dy, const Tensor& x,
                     const Tensor& w, const Tensor& rstd) {
  const char* op = "RmsNormBackward";
  const int64_t T = x.size(0), C = x.size(1);
  ExpectTensor(op, "dx", dx, DType::kF32, {T, C});
  ExpectTensor(op, "dw", dw, DType::kF32, {C});
  ExpectTensor(op, "dy", dy, DType::kF32, {T, C});
  ExpectTensor(op, "w", w, DType::kF32, {C});
  ExpectTensor(op, "rstd", rstd, DType::kF32, {T});
  const Device device = internal::CommonDevice(op, {&dx, &dw, &dy, &x, &w, &rstd});
  if (device.is_cpu()) {
    return cpu::RmsNormBackward(dx.f32(), dw.f32(), dy.f32(), x.f32(), w.f32(), rstd.f32(), T, C);
  }
  internal::NoBackend(op, device);
}

}  // namespace prl::kernels
