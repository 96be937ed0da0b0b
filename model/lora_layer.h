// A decoder layer's LoRA adapters (model/lora.h) in the forward and the backward: each
// targeted projection's output gains scale * (x A^T) B^T in its columns of the fused output,
// and the backward adds the adapter's share of the gradient at x and accumulates the gradients
// of A and B. The base weights' gradients are the caller's (the adapters leave them unchanged).
// CPU (F32) only for now (kernels::AddColumns).
#pragma once

#include <cstdint>

#include "core/arena.h"
#include "core/tensor.h"
#include "kernels/reduction_order.h"
#include "model/config.h"
#include "model/lora.h"

namespace prl {

// The rows of a batch one adapter applies to, in one layer (an engine step whose requests name
// several adapters).
struct LoraRows {
  const LoraLayerParams* layer = nullptr;  // the adapter's layer
  double scale = 0.0;
  Tensor rows;  // (n) I32, distinct
};

// One layer's adapter scratch for T tokens, shared by the layers (nothing is kept between the
// forward and the backward: x A^T is recomputed).
struct LoraScratch {
  Tensor t;   // (T, r) x A^T
  Tensor dt;  // (T, r)
  Tensor u;   // (T * max out) B (x A^T)^T, or the scaled gradient at it
  Tensor dx;  // (T * max in) the adapter's gradient at x
  Tensor xg;  // (T * max in) the rows of x of one adapter (LoraForwardRows)
};
LoraScratch TakeLoraScratch(Arena& arena, const ModelConfig& config, int64_t T, int64_t rank);

// out (T, W) columns [site.out_col, + site.out) += scale * (x (T, site.in) A^T) B^T, the
// products in `order` (the batch-invariant order keeps a row's result whatever the batch).
void LoraForward(const LoraPair& p, double scale, const LoraSite& site, const Tensor& x,
                 const Tensor& out, const LoraScratch& s,
                 kernels::ReductionOrder order = kernels::ReductionOrder::kFast);

// The same for the rows `rows` (n) I32 of x and out only (the requests of one adapter in a
// batch of several, as Punica and S-LoRA run them): x's rows are gathered, the products run on
// them, and the result is added into out's rows. In the batch-invariant order a row's result
// is LoraForward's bit for bit.
void LoraForwardRows(const LoraPair& p, double scale, const LoraSite& site, const Tensor& x,
                     const Tensor& out, const Tensor& rows, const LoraScratch& s,
                     kernels::ReductionOrder order);

// dout (T, W): the gradient at the projection's whole output. g.a += its gradient, g.b too;
// dx (T, site.in) += the adapter's gradient at x.
void LoraBackward(const LoraPair& p, const LoraPair& g, double scale, const LoraSite& site,
                  const Tensor& x, const Tensor& dout, const Tensor& dx, const LoraScratch& s);

}  // namespace prl
