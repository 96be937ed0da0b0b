// Linear layers: y = x W^T (+ b), with W in Hugging Face's (out_features, in_features) layout.
#pragma once

#include "core/tensor.h"
#include "kernels/reduction_order.h"

namespace prl::kernels {

// out (M, N) = a (M, K) . w (N, K)^T + bias (N, optional); with accumulate, out += that.
// Accumulating lets a residual connection be fused into the projection that feeds it.
// order = kBatchInvariant makes each output element independent of M (reduction_order.h).
void MatmulForward(const Tensor& out, const Tensor& a, const Tensor& w, const Tensor& bias = {},
                   bool accumulate = false, ReductionOrder order = ReductionOrder::kFast);

// da (M, K) = dout . w (skipped if undefined); dw (N, K) += dout^T . a;
// dbias (N) += column sums of dout (skipped if undefined).
void MatmulBackward(const Tensor& da, const Tensor& dw, const Tensor& dbias, const Tensor& dout,
                    const Tensor& a, const Tensor& w);

}  // namespace prl::kernels
