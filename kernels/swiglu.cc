#include "kernels/swiglu.h"

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/dispatch.h"
#if PRL_WITH_CUDA
#include "kernels/cuda/cuda_ops.h"
#endif

namespace prl::kernels {

using internal::ExpectTensor;

void SwiGluForward(const Tensor& act, const Tensor& gate_up) {
  const char* op = "SwiGluForward";
  const int64_t T = gate_up.size(0), I = gate_up.size(1) / 2;
  const DType dt = internal::ActivationDType(gate_up);
  ExpectTensor(op, "gate_up", gate_up, dt, {T, 2 * I});
  ExpectTensor(op, "act", act, dt, {T, I});
  const Device device = internal::CommonDevice(op, {&act, &gate_up});
  if (device.is_cpu()) return cpu::SwiGluForward(act.f32(), gate_up.f32(), T, I);
#if PRL_WITH_CUDA
  return cuda::SwiGluForward(device.index, dt, act.data, gate_up.data, T, I);
#else
  internal::NoBackend(op, device);
#endif
}

void SwiGluBackward(const Tensor& dgate_up, const Tensor& dact, const Tensor& gate_up) {
  const char* op = "SwiGluBackward";
  const int64_t T = gate_up.size(0), I = gate_up.size(1) / 2;
  const DType dt = internal::ActivationDType(gate_up);
  ExpectTensor(op, "gate_up", gate_up, dt, {T, 2 * I});
  ExpectTensor(op, "dgate_up", dgate_up, dt, {T, 2 * I});
  ExpectTensor(op, "dact", dact, dt, {T, I});
  const Device device = internal::CommonDevice(op, {&dgate_up, &dact, &gate_up});
  if (device.is_cpu()) return cpu::SwiGluBackward(dgate_up.f32(), dact.f32(), gate_up.f32(), T, I);
#if PRL_WITH_CUDA
  return cuda::SwiGluBackward(device.index, dt, dgate_up.data, dact.data, gate_up.data, T, I);
#else
  internal::NoBackend(op, device);
#endif
}

}  // namespace prl::kernels
