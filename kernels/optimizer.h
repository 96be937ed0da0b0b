// Optimizer and gradient-bookkeeping kernels on flat fp32 shards (the learner's FSDP shards):
// AdamW and SGD updates, in-place accumulation, sum of squares for the global grad norm.
//
// Dtypes: parameters, gradients and optimizer state are F32 on every backend (the fp32
// master weights); AdamWUpdateWithBf16Copy also writes a BF16 copy (the bf16 mode's compute
// weights). AddInPlace and SumOfSquares take F32 on the CPU and F32 or BF16 on CUDA.
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

// AdamWUpdate, then param_bf16 (N, BF16) = the updated param rounded to nearest even, for
// [begin, end): on CUDA in the same pass over memory.
void AdamWUpdateWithBf16Copy(const Tensor& param, const Tensor& grad, const Tensor& m,
                             const Tensor& v, const Tensor& param_bf16, int64_t begin, int64_t end,
                             bool decay, const AdamWStep& step);

// p -= lr * (grad_scale * grad + (decay ? wd * p : 0)) for elements [begin, end).
void SgdUpdate(const Tensor& param, const Tensor& grad, int64_t begin, int64_t end, bool decay,
               float lr, float weight_decay, float grad_scale);

// dst += src, same shape.
void AddInPlace(const Tensor& dst, const Tensor& src);

// sum of x^2 over all elements, accumulated in float64. On CUDA a fixed-shape two-pass tree:
// the same value on every run (it synchronises the calling thread's stream).
double SumOfSquares(const Tensor& x);

}  // namespace prl::kernels
