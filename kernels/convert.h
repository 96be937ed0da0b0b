// Element-wise dtype conversion (F32 <-> BF16, round to nearest even): the bf16 mode's compute
// weights from the fp32 master weights, and BF16 results back to F32.
#pragma once

#include "core/tensor.h"

namespace prl::kernels {

// dst = src converted; same element count, same device; F32 or BF16 on either side. Equal
// dtypes make it a copy; on CUDA it is queued on the current stream (capturable in a graph).
void ConvertDType(const Tensor& dst, const Tensor& src);

}  // namespace prl::kernels
