// Optimizer and gradient-bookkeeping kernels on flat fp32 shards (the learner's FSDP shards):
// AdamW and SGD updates, in-place accumulation, sum of squares for the global grad norm.
#pragma once

#include "core/tensor.h"

namespace prl::kernels {

struct AdamWStep {
  float lr = 0;
  float beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f;
  float weight_decay = 0;  // decoupled (AdamW): p -= lr * wd * p, where `decay` applies
  int64_t step = 1;        // 1-based, for the bias corrections
  float grad_scale = 1;    // g is multiplied by this first (global-norm clipping)
};

// For elements [begin, end) of the flat (N) tensors, torch.optim.AdamW's update:
//   g = grad_scale * grad; m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2
//   p -= lr * (wd * p [if decay]) ; p -= lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)
void AdamWUpdate(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v,
                 int64_t begin, int64_t end, bool decay, const AdamWStep& step);

// p -= lr * (grad_scale * grad + (decay ? wd * p : 0)) for elements [begin, end).
void SgdUpdate(const Tensor& param, const Tensor& grad, int64_t begin, int64_t end, bool decay,
               float lr, float weight_decay, float grad_scale);

// dst += src, same shape.
void AddInPlace(const Tensor& dst, const Tensor& src);

// sum of x^2 over all elements, accumulated in float64.
double SumOfSquares(const Tensor& x);

}  // namespace prl::kernels
