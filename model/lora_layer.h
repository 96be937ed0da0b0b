// A decoder layer's LoRA adapters (model/lora.h) in the forward and the backward: each
// targeted projection's output gains scale * (x A^T) B^T in its columns of the fused output,
// and the backward adds the adapter's share of the gradient at x and accumulates the gradients
// of A and B. The base weights' gradients are the caller's (the adapters leave them unchanged).
//
// Dtypes: the adapters are F32 always (their weights and gradients). The activations x, out,
// dout and dx are F32, or on CUDA BF16 (a BF16 model): x is read as F32 (converted exactly into
// the scratch), the adapter's products run in F32 and its result is added into the BF16
// output with one rounding (kernels::AddColumns). CUDA's paths are written, not yet run on a
// GPU (TransformerOptions::cuda_lora, tests/model/cuda_lora_test.cc).
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

// The rows [begin, end) of a batch one adapter applies to, in one layer (a learner's pass over
// several adapters' micro-batches packed together: model/lora.h LoraSegment).
struct LoraLayerSegment {
  const LoraLayerParams* layer = nullptr;  // the adapter's layer
  double scale = 0.0;
  int64_t begin = 0, end = 0;
};

// One layer's adapter scratch for T tokens, shared by the layers (nothing is kept between the
// forward and the backward: x A^T is recomputed). `rank`: the largest adapter's; a call on
// fewer rows or a smaller rank uses the scratch's prefix.
struct LoraScratch {
  Tensor xf;  // (T * max in) F32: x as F32 (LoraInput); only with activations not F32
  Tensor t;   // (T, r) x A^T
  Tensor dt;  // (T, r)
  Tensor u;   // (T * max out) B (x A^T)^T, or the scaled gradient at it
  Tensor dx;  // (T * max in) the adapter's gradient at x
  Tensor xg;  // (T * max in) the rows of x of one adapter (LoraForwardRows)
};
// activations: the dtype of x and out (F32, or BF16 on CUDA).
LoraScratch TakeLoraScratch(Arena& arena, const ModelConfig& config, int64_t T, int64_t rank,
                            DType activations = DType::kF32);

// x (T, in) as F32: x itself when it is F32, else converted into s.xf. The targets that share an
// input (q, k, v; gate, up) convert it once and pass the result on.
Tensor LoraInput(const Tensor& x, const LoraScratch& s);

// out (T, W) columns [site.out_col, + site.out) += scale * (x (T, site.in) A^T) B^T (x read
// through LoraInput), the products in `order` (the batch-invariant order keeps a row's result
// whatever the batch).
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
