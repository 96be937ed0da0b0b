#include "kernels/matmul.h"

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/dispatch.h"

namespace prl::kernels {

using internal::ExpectTensor;

void MatmulForward(const Tensor& out, const Tensor& a, const Tensor& w, const Tensor& bias,
                   bool accumulate, ReductionOrder order) {
  const char* op = "MatmulForward";
  const int64_t M = a.size(0), K = a.size(1), N = w.size(0);
  ExpectTensor(op, "out", out, DType::kF32, {M, N});
  ExpectTensor(op, "a", a, DType::kF32, {M, K});
  ExpectTensor(op, "w", w, DType::kF32, {N, K});
  if (bias.defined()) ExpectTensor(op, "bias", bias, DType::kF32, {N});
  const Device device = internal::CommonDevice(op, {&out, &a, &w, &bias});
  if (device.is_cpu()) {
    const float* b = bias.defined() ? bias.f32() : nullptr;
    if (order == ReductionOrder::kBatchInvariant) {
      return cpu::MatmulForwardInvariant(out.f32(), a.f32(), w.f32(), b, M, N, K, accumulate);
    }
    return cpu::MatmulForward(out.f32(), a.f32(), w.f32(), b, M, N, K, accumulate);
  }
  internal::NoBackend(op, device);
}

void MatmulBackward(const Tensor& da, const Tensor& dw, const Tensor& dbias, const Tensor& dout,
                    const Tensor& a, const Tensor& w) {
  const char* op = "MatmulBackward";
  const int64_t M = a.size(0), K = a.size(1), N = w.size(0);
  if (da.defined()) ExpectTensor(op, "da", da, DType::kF32, {M, K});
  ExpectTensor(op, "dw", dw, DType::kF32, {N, K});
  if (dbias.defined()) ExpectTensor(op, "dbias", dbias, DType::kF32, {N});
  ExpectTensor(op, "dout", dout, DType::kF32, {M, N});
  ExpectTensor(op, "w", w, DType::kF32, {N, K});
  const Device device = internal::CommonDevice(op, {&da, &dw, &dbias, &dout, &a, &w});
  if (device.is_cpu()) {
    return cpu::MatmulBackward(da.defined() ? da.f32() : nullptr, dw.f32(),
                               dbias.defined() ? dbias.f32() : nullptr, dout.f32(), a.f32(),
                               w.f32(), M, N, K);
  }
  internal::NoBackend(op, device);
}

}  // namespace prl::kernels
