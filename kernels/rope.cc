#include "kernels/rope.h"

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/dispatch.h"
#if PRL_WITH_CUDA
#include "kernels/cuda/cuda_ops.h"
#endif

namespace prl::kernels {

using internal::ExpectTensor;

void RopeTables(const Tensor& cos, const Tensor& sin, const Tensor& positions,
                const Tensor& inv_freq) {
  const char* op = "RopeTables";
  const int64_t T = positions.size(0), half = inv_freq.size(0);
  ExpectTensor(op, "cos", cos, DType::kF32, {T, half});
  ExpectTensor(op, "sin", sin, DType::kF32, {T, half});
  ExpectTensor(op, "positions", positions, DType::kI32, {T});
  ExpectTensor(op, "inv_freq", inv_freq, DType::kF32, {half});
  const Device device = internal::CommonDevice(op, {&cos, &sin, &positions, &inv_freq});
  if (device.is_cpu()) {
    return cpu::RopeTables(cos.f32(), sin.f32(), positions.i32(), inv_freq.f32(), T, half);
  }
#if PRL_WITH_CUDA
  return cuda::RopeTables(device.index, cos.f32(), sin.f32(), positions.i32(), inv_freq.f32(), T,
                          half);
#else
  internal::NoBackend(op, device);
#endif
}

void RopeApply(const Tensor& x, int64_t num_heads, int64_t head_dim, const Tensor& cos,
               const Tensor& sin, bool inverse) {
  const char* op = "RopeApply";
  const int64_t T = x.size(0), W = x.size(1);
  PRL_CHECK(head_dim % 2 == 0, op, ": head_dim ", head_dim, " must be even");
  PRL_CHECK(num_heads * head_dim <= W, op, ": ", num_heads, " heads of ", head_dim,
            " exceed row width ", W);
  const DType dt = internal::ActivationDType(x);
  ExpectTensor(op, "x", x, dt, {T, W});
  ExpectTensor(op, "cos", cos, DType::kF32, {T, head_dim / 2});
  ExpectTensor(op, "sin", sin, DType::kF32, {T, head_dim / 2});
  const Device device = internal::CommonDevice(op, {&x, &cos, &sin});
  if (device.is_cpu()) {
    return cpu::RopeApply(x.f32(), T, num_heads, head_dim, W, cos.f32(), sin.f32(), inverse);
  }
#if PRL_WITH_CUDA
  return cuda::RopeApply(device.index, dt, x.data, T, num_heads, head_dim, W, cos.f32(), sin.f32(),
                         inverse);
#else
  internal::NoBackend(op, device);
#endif
}

}  // namespace prl::kernels
