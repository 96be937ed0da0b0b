// Token embedding lookup.
#pragma once

#include "core/tensor.h"

namespace prl::kernels {

// out (T, C) = table (V, C)[tokens (T, I32)]. Token ids must be in [0, V) (validated upstream).
void EmbeddingForward(const Tensor& out, const Tensor& table, const Tensor& tokens);
// dtable (V, C) += dout (T, C) scattered to the rows of tokens.
void EmbeddingBackward(const Tensor& dtable, const Tensor& dout, const Tensor& tokens);

}  // namespace prl::kernels
