// Shared checks of the kernel dispatchers: every kernel entry point (kernels/*.h) verifies
// shapes, dtypes and that all its tensors live on one device, then calls the backend of that
// device. A backend without the kernel is a programmer error (devices are resolved through
// prl::ResolveDevice, which only hands out devices whose backend is compiled in).
#pragma once

#include <initializer_list>

#include "core/check.h"
#include "core/tensor.h"

namespace prl::kernels::internal {

// The device shared by all defined tensors in `tensors` (undefined ones are skipped).
Device CommonDevice(const char* op, std::initializer_list<const Tensor*> tensors);

// Checks that `t` is defined, has dtype `dtype` and exactly the shape `shape`.
void ExpectTensor(const char* op, const char* name, const Tensor& t, DType dtype,
                  std::initializer_list<int64_t> shape);

[[noreturn]] void NoBackend(const char* op, Device device);

// The storage dtype of a call's activations, taken from `reference`: F32 on the CPU (the only
// one it has); F32 (exact mode) or BF16 on CUDA. Other dtypes give F32, so that ExpectTensor
// reports the mismatch.
inline DType ActivationDType(const Tensor& reference) {
  if (reference.device.is_cuda() &&
      (reference.dtype == DType::kF32 || reference.dtype == DType::kBF16)) {
    return reference.dtype;
  }
  return DType::kF32;
}

}  // namespace prl::kernels::internal
