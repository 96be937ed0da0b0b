#include "kernels/swiglu.h"

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/dispatch.h"

namespace prl::kernels {

using internal::ExpectTensor;

void SwiGluForward(const Tensor& act, const Tensor& gate_up) {
  const char* op = "SwiGluForward";
  const int64_t T = gate_up.size(0), I = gate_up.size(1) / 2;
  ExpectTensor(op, "gate_up", gate_up, DType::kF32, {T, 2 * I});
  ExpectTensor(op, "act", act, DType::kF32, {T, I});
  const Device device = internal::CommonDevice(op, {&act, &gate_up});
  if (device.is_cpu()) return cpu::SwiGluForward(act.f32(), gate_up.f32(), T, I);
  internal::NoBackend(op, device);
}

void SwiGluBackward(const Tensor& dgate_up, const Tensor& dact, const Tensor& gate_up) {
  const char* op = "SwiGluBackward";
  const int64_t T = gate_up.size(0), I = gate_up.size(1) / 2;
  ExpectTensor(op, "gate_up", gate_up, DType::kF32, {T, 2 * I});
  ExpectTensor(op, "dgate_up", dgate_up, DType::kF32, {T, 2 * I});
  ExpectTensor(op, "dact", dact, DType::kF32, {T, I});
  const Device device = internal::CommonDevice(op, {&dgate_up, &dact, &gate_up});
  if (device.is_cpu()) return cpu::SwiGluBackward(dgate_up.f32(), dact.f32(), gate_up.f32(), T, I);
  internal::NoBackend(op, device);
}

}  // namespace prl::kernels
