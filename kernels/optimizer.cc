#include "kernels/optimizer.h"

#include "core/dtype.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/dispatch.h"
#if PRL_WITH_CUDA
#include "kernels/cuda/cuda_ops.h"
#endif

namespace prl::kernels {

using internal::ExpectTensor;

namespace {
void ExpectRange(const char* op, const Tensor& t, int64_t begin, int64_t end) {
  PRL_CHECK(0 <= begin && begin <= end && end <= t.numel(), op, ": range [", begin, ", ", end,
            ") outside a tensor of ", t.numel(), " elements");
}
}  // namespace

namespace {
// AdamWUpdate and AdamWUpdateWithBf16Copy (param_bf16 undefined: no copy).
void AdamW(const char* op, const Tensor& param, const Tensor& grad, const Tensor& m,
           const Tensor& v, const Tensor& param_bf16, int64_t begin, int64_t end, bool decay,
           const AdamWStep& step) {
  const int64_t n = param.numel();
  ExpectTensor(op, "param", param, DType::kF32, {n});
  ExpectTensor(op, "grad", grad, DType::kF32, {n});
  ExpectTensor(op, "m", m, DType::kF32, {n});
  ExpectTensor(op, "v", v, DType::kF32, {n});
  const bool copy = param_bf16.defined();
  if (copy) ExpectTensor(op, "param_bf16", param_bf16, DType::kBF16, {n});
  ExpectRange(op, param, begin, end);
  PRL_CHECK(step.step >= 1, op, ": step is 1-based, found ", step.step);
  const Device device = internal::CommonDevice(op, {&param, &grad, &m, &v, &param_bf16});
  uint16_t* bf16 = copy ? static_cast<uint16_t*>(param_bf16.data) + begin : nullptr;
  if (device.is_cpu()) {
    cpu::AdamWUpdate(param.f32() + begin, grad.f32() + begin, m.f32() + begin, v.f32() + begin,
                     end - begin, decay, step);
    if (copy) {
      ConvertFromF32(bf16, DType::kBF16, param.f32() + begin, static_cast<size_t>(end - begin));
    }
    return;
  }
#if PRL_WITH_CUDA
  return cuda::AdamWUpdate(device.index, param.f32() + begin, grad.f32() + begin, m.f32() + begin,
                           v.f32() + begin, end - begin, decay, step.lr, step.beta1, step.beta2,
                           step.eps, step.weight_decay, step.step, step.grad_scale, bf16);
#else
  internal::NoBackend(op, device);
#endif
}
}  // namespace

void AdamWUpdate(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v,
                 int64_t begin, int64_t end, bool decay, const AdamWStep& step) {
  AdamW("AdamWUpdate", param, grad, m, v, Tensor(), begin, end, decay, step);
}

void AdamWUpdateWithBf16Copy(const Tensor& param, const Tensor& grad, const Tensor& m,
                             const Tensor& v, const Tensor& param_bf16, int64_t begin, int64_t end,
                             bool decay, const AdamWStep& step) {
  AdamW("AdamWUpdateWithBf16Copy", param, grad, m, v, param_bf16, begin, end, decay, step);
}

void SgdUpdate(const Tensor& param, const Tensor& grad, int64_t begin, int64_t end, bool decay,
               float lr, float weight_decay, float grad_scale) {
  const char* op = "SgdUpdate";
  const int64_t n = param.numel();
  ExpectTensor(op, "param", param, DType::kF32, {n});
  ExpectTensor(op, "grad", grad, DType::kF32, {n});
  ExpectRange(op, param, begin, end);
  const Device device = internal::CommonDevice(op, {&param, &grad});
  if (device.is_cpu()) {
    return cpu::SgdUpdate(param.f32() + begin, grad.f32() + begin, end - begin,
                          decay ? weight_decay : 0.0f, lr, grad_scale);
  }
#if PRL_WITH_CUDA
  return cuda::SgdUpdate(device.index, param.f32() + begin, grad.f32() + begin, end - begin,
                         decay ? weight_decay : 0.0f, lr, grad_scale);
#else
  internal::NoBackend(op, device);
#endif
}

void AddInPlace(const Tensor& dst, const Tensor& src) {
  const char* op = "AddInPlace";
  const int64_t n = dst.numel();
  const DType dt = internal::ActivationDType(dst);
  ExpectTensor(op, "dst", dst, dt, {n});
  ExpectTensor(op, "src", src, dt, {n});
  const Device device = internal::CommonDevice(op, {&dst, &src});
  if (device.is_cpu()) return cpu::AddInPlace(dst.f32(), src.f32(), n);
#if PRL_WITH_CUDA
  return cuda::AddInPlace(device.index, dt, dst.data, src.data, n);
#else
  internal::NoBackend(op, device);
#endif
}

double SumOfSquares(const Tensor& x) {
  const char* op = "SumOfSquares";
  ExpectTensor(op, "x", x, internal::ActivationDType(x), {x.numel()});
  const Device device = internal::CommonDevice(op, {&x});
  if (device.is_cpu()) return cpu::SumOfSquares(x.f32(), x.numel());
#if PRL_WITH_CUDA
  return cuda::SumOfSquares(device.index, x.dtype, x.data, x.numel());
#else
  internal::NoBackend(op, device);
#endif
}

}  // namespace prl::kernels
