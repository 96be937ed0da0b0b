// Wrapping test vectors as kernel Tensors (CPU views).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <vector>

#include "core/tensor.h"

namespace prl::testing {

inline Tensor View(std::vector<float>& v, std::initializer_list<int64_t> shape) {
  return Tensor(v.data(), DType::kF32, Device::Cpu(), shape);
}
inline Tensor View(std::vector<int32_t>& v, std::initializer_list<int64_t> shape) {
  return Tensor(v.data(), DType::kI32, Device::Cpu(), shape);
}

}  // namespace prl::testing
