// Token embedding lookup.
//
// Dtypes: tokens are I32. The CPU takes F32. On CUDA out and table share F32 or BF16; dtable
// is F32 (weight gradients) or BF16 (the bf16 mode's row scatter-add) and dout F32 or BF16.
// The CUDA backward adds with atomics, so repeated tokens' rows are summed in no fixed order:
// not bit-deterministic (within fp32 rounding of the CPU's result).
#pragma once

#include "core/tensor.h"

namespace prl::kernels {

// out (T, C) = table (V, C)[tokens (T, I32)]. Token ids must be in [0, V) (validated upstream).
void EmbeddingForward(const Tensor& out, const Tensor& table, const Tensor& tokens);
// dtable (V, C) += dout (T, C) scattered to the rows of tokens.
void EmbeddingBackward(const Tensor& dtable, const Tensor& dout, const Tensor& tokens);

}  // namespace prl::kernels
