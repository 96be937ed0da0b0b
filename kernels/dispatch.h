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

}  // namespace prl::kernels::internal
