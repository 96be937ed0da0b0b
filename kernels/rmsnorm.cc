#include "kernels/rmsnorm.h"

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/dispatch.h"
#if PRL_WITH_CUDA
#include "kernels/cuda/cuda_ops.h"
#endif

namespace prl::kernels {

using internal::ExpectTensor;

void RmsNormForward(const Tensor& y, const Tensor& rstd, const Tensor& x, const Tensor& w,
                    float eps) {
  const char* op = "RmsNormForward";
  const int64_t T = x.size(0), C = x.size(1);
  const DType dt = internal::ActivationDType(x);
  ExpectTensor(op, "x", x, dt, {T, C});
  ExpectTensor(op, "y", y, dt, {T, C});
  ExpectTensor(op, "rstd", rstd, DType::kF32, {T});
  ExpectTensor(op, "w", w, dt, {C});
  const Device device = internal::CommonDevice(op, {&y, &rstd, &x, &w});
  if (device.is_cpu()) return cpu::RmsNormForward(y.f32(), rstd.f32(), x.f32(), w.f32(), T, C, eps);
#if PRL_WITH_CUDA
  return cuda::RmsNormForward(device.index, dt, y.data, rstd.f32(), x.data, w.data, T, C, eps);
#else
  internal::NoBackend(op, device);
#endif
}

void RmsNormBackward(const Tensor& dx, const Tensor& dw, const Tensor& dy, const Tensor& x,
                     const Tensor& w, const Tensor& rstd) {
  const char* op = "RmsNormBackward";
  const int64_t T = x.size(0), C = x.size(1);
  const DType dt = internal::ActivationDType(x);
  ExpectTensor(op, "x", x, dt, {T, C});
  ExpectTensor(op, "dx", dx, dt, {T, C});
  if (dw.defined()) ExpectTensor(op, "dw", dw, DType::kF32, {C});
  ExpectTensor(op, "dy", dy, dt, {T, C});
  ExpectTensor(op, "w", w, dt, {C});
  ExpectTensor(op, "rstd", rstd, DType::kF32, {T});
  const Device device = internal::CommonDevice(op, {&dx, &dw, &dy, &x, &w, &rstd});
  if (device.is_cpu()) {
    return cpu::RmsNormBackward(dx.f32(), dw.defined() ? dw.f32() : nullptr, dy.f32(), x.f32(),
                                w.f32(), rstd.f32(), T, C);
  }
#if PRL_WITH_CUDA
  return cuda::RmsNormBackward(device.index, dt, dx.data, dw.defined() ? dw.f32() : nullptr,
                               dy.data, x.data, w.data, rstd.f32(), T, C);
#else
  internal::NoBackend(op, device);
#endif
}

}  // namespace prl::kernels
