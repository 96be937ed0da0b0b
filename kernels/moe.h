// Qwen3-MoE's routing and row movement, on every backend (model/moe_layer.h has the math and
// calls these; the experts' GEMMs are kernels::MatmulForward over each expert's row range).
// Shapes: T tokens, E experts (at most 256), K experts per token, N = T K routed rows, C the
// hidden size. Activations (in, x, y, out, residual, dout, dy, dx, dxs) share one storage dtype
// (F32 on the CPU; F32 or BF16 on CUDA); routing tensors are F32 and I32. All tensors of a call
// live on one device. Every output element is a fixed-order function of its own token's data,
// so a token's routes and rows do not depend on the batch around it.
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace prl::kernels {

// probs (T, E) F32 = softmax(logits (T, E) F32), in place when probs is logits; recomputed
// (T, K) I32 = the K largest probabilities by decreasing value, ties to the lower expert id;
// routes (T, K) I32 = forced[t] for a replayed row (forced defined, forced[t, 0] >= 0: K
// distinct ids in [0, E), validated upstream), else recomputed[t]; weights (T, K) F32 = probs
// at routes, divided by their sum (fp32, in k order) iff renormalise.
void MoeRoute(const Tensor& probs, const Tensor& recomputed, const Tensor& routes,
              const Tensor& weights, const Tensor& logits, const Tensor& forced, bool renormalise);

// A stable counting sort of the N pairs i = t K + k by routes (T, K) I32 over E experts:
// expert_begin (E + 1) I32, row_of (N) I32 (pair i's row), token_of (N) I32 (row r's token).
// Within an expert the rows keep pair order; the same result on every backend.
void MoeSortByExpert(const Tensor& expert_begin, const Tensor& row_of, const Tensor& token_of,
                     const Tensor& routes, int64_t E);

// x (N, C) [r] = in (T, C) [token_of[r]].
void MoeGatherRows(const Tensor& x, const Tensor& in, const Tensor& token_of);

// out (T, C) [t] = residual[t] + sum_k weights[t, k] y[row_of[t K + k]], k in order in fp32.
// out must not alias y.
void MoeCombine(const Tensor& out, const Tensor& residual, const Tensor& y, const Tensor& weights,
                const Tensor& row_of);

// MoeCombine's backward: dy (N, C) [row_of[t K + k]] = weights[t, k] dout[t] (every row
// written); dweights (T, K) F32 [t, k] = <dout[t], y[row_of[t K + k]]>, summed in double.
void MoeCombineBackward(const Tensor& dy, const Tensor& dweights, const Tensor& dout,
                        const Tensor& y, const Tensor& weights, const Tensor& row_of);

// dlogits (T, E) F32, the gradient at the router's logits, from dweights (T, K) F32 through
// weights = probs[routes] (/ their sum iff renormalise) and probs = softmax(logits), plus
// aux_dprobs (E) F32 (undefined: none) added to every token's gradient at probs.
void MoeRouterBackward(const Tensor& dlogits, const Tensor& probs, const Tensor& routes,
                       const Tensor& weights, const Tensor& dweights, const Tensor& aux_dprobs,
                       bool renormalise);

// dx (T, C) [t] += sum_k dxs (N, C) [row_of[t K + k]], added in k order in fp32.
void MoeScatterAddRows(const Tensor& dx, const Tensor& dxs, const Tensor& row_of);

}  // namespace prl::kernels
