// RMSNorm as in Llama and Qwen2: y = x / sqrt(mean(x^2) + eps) * w, in fp32.
//
// Dtypes: the CPU takes F32. On CUDA y, x, w, dx and dy share F32 or BF16 (fp32 arithmetic);
// rstd and dw are F32. dw is summed over rows in a fixed order on both (deterministic).
#pragma once

#include "core/tensor.h"

namespace prl::kernels {

// y (T, C) =, rstd (T) = 1/sqrt(mean(x^2) + eps) (kept for the backward); x (T, C), w (C).
void RmsNormForward(const Tensor& y, const Tensor& rstd, const Tensor& x, const Tensor& w,
                    float eps);
// dx (T, C) += and dw (C) += the gradients, given dy (T, C) and the forward's x, w, rstd. dw
// undefined: a frozen weight, skipped (CPU only for now).
void RmsNormBackward(const Tensor& dx, const Tensor& dw, const Tensor& dy, const Tensor& x,
                     const Tensor& w, const Tensor& rstd);

}  // namespace prl::kernels
