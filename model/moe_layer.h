// Qwen3-MoE's sparse MLP block (transformers' Qwen3MoeSparseMoeBlock), forward and backward,
// grouped by expert. Used by DecoderLayerForward for the layers ModelConfig::IsMoeLayer names,
// so the learner and the engine route through this one code.
//
// Routing, per token t:
//   logits = x_t . W_router^T (E) in fp32; p = softmax(logits) over all E experts;
//   routes = the K experts of largest p, by decreasing p. Ties (equal fp32 probabilities) go
//   to the lower expert id, so routing is a deterministic function of p;
//   w_k = p[routes_k], divided by sum_k p[routes_k] iff norm_topk_prob;
//   out_t = residual_t + sum_k w_k * expert_{routes_k}(x_t), summed in k order, where
//   expert_e(x) = down_e(silu(gate_e(x)) * up_e(x)).
// A replayed token (MoeForward's forced_routes) uses the given experts instead of its top-K, with
// the weights of the same formula over them, so gradients still reach the router through p.
//
// The work is grouped by expert: the (token, k) pairs are sorted by expert (then token), each
// expert's tokens gathered into contiguous rows, and each expert runs one gate|up GEMM, SwiGLU
// and one down GEMM over its rows; the weighted sums are a scatter over tokens. Every GEMM takes
// the layer's reduction order, so in the batch-invariant order a token's routes and output do
// not depend on the other tokens of the batch (the engine's routes equal the learner's).
//
// Backends: the routing, sort, gather and combine are kernels/moe.h (CPU, and CUDA on the
// device: the sort too); each expert's GEMMs are kernels::MatmulForward over its row range,
// whose bounds the host reads once per layer (E + 1 integers, a synchronising copy on CUDA,
// which is why the engine does not capture a MoE model's steps in CUDA graphs). Activations in
// the compute dtype (F32, or BF16 on CUDA); router probabilities and weights in F32.
//
// The optional load-balancing loss (transformers' load_balancing_loss_func, off by default in
// RL) over a pass of T tokens and its Lm MoE layers: f_e = count_e / (Lm T), where count_e
// is how many of the Lm T K choices of the routers' own top-K (also where routes are replayed)
// went to expert e; P_e = the mean of p[e] over the Lm T (layer, token) rows; and
// aux = E sum_e f_e P_e. f is a count (no gradient); the gradient reaches the routers through
// P: d aux / d p[t, e] = E f_e / (Lm T) in every MoE layer (MoeBackward's aux_dprobs).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/arena.h"
#include "kernels/reduction_order.h"
#include "model/config.h"
#include "model/parameters.h"

namespace prl {

// One MoE layer's forward state for T tokens (what the backward reads). N = T K routed rows.
struct MoeActivations {
  Tensor probs;         // (T, E) F32 softmax of the router logits
  Tensor routes;        // (T, K) I32 the experts used (recomputed, or replayed)
  Tensor recomputed;    // (T, K) I32 the router's own top-K (equal to routes unless replayed)
  Tensor weights;       // (T, K) F32 the experts' weights w_k
  Tensor row_of;        // (T K) I32 sorted row of pair (t, k)
  Tensor token_of;      // (N) I32 token of each sorted row
  Tensor expert_begin;  // (E + 1) I32 first sorted row of each expert
  Tensor x;             // (N, C) each row's input
  Tensor gate_up;       // (N, 2 Im)
  Tensor act;           // (N, Im)
  Tensor y;             // (N, C) each row's expert output, before its weight
  Tensor forced;        // (T, K) I32 the replayed routes on the device (CUDA)
  // expert_begin on the host (what the per-expert GEMMs read), as of the last MoeForward.
  std::shared_ptr<std::vector<int32_t>> begin_host;
};
// x, gate_up, act and y in dt (the compute dtype); on the arena's device.
MoeActivations TakeMoeActivations(Arena& arena, const ModelConfig& config, int64_t T, DType dt);

// Backward scratch, shared by the layers.
struct MoeScratch {
  Tensor dy;         // (N, C)
  Tensor dact;       // (N, Im)
  Tensor dgate_up;   // (N, 2 Im)
  Tensor dx;         // (N, C)
  Tensor dlogits;    // (T, E) F32
  Tensor dlogits_c;  // (T, E) in the compute dtype (dlogits itself when that is F32)
  Tensor dweights;   // (T, K) F32
  Tensor aux;        // (E) F32 the load-balancing loss's gradient at the probabilities
};
MoeScratch TakeMoeScratch(Arena& arena, const ModelConfig& config, int64_t T, DType dt);

// out (T, C) = residual (T, C) + MoE(x (T, C)); out must not alias x or residual.
// forced_routes: null (every token routed by the router), or (T, K) host I32 where row t is
// replayed when forced_routes[t K] >= 0 (then K distinct ids in [0, E), validated upstream:
// ValidatePackedBatch) and routed by the router otherwise.
void MoeForward(const ModelConfig& config, kernels::ReductionOrder order, const LayerParams& p,
                const MoeActivations& a, const Tensor& x, const Tensor& residual, const Tensor& out,
                const int32_t* forced_routes = nullptr);

// Given dout (T, C), the gradient at out: dx (T, C) = the gradient at x (overwritten);
// g.router_weight, g.experts_gate_up, g.experts_down +=. The residual's gradient is dout itself.
// aux_dprobs: null, or (E) a gradient at every token's router probabilities p[t, e] added to
// the one the block's output gives (the load-balancing loss's, above).
void MoeBackward(const ModelConfig& config, const LayerParams& p, const LayerParams& g,
                 const MoeActivations& a, const Tensor& x, const Tensor& dout, const Tensor& dx,
                 const MoeScratch& s, const double* aux_dprobs = nullptr);

// The last MoeForward's routes, the router's own top-K (T, K) and its probabilities (T, E), on
// the host (copied from the device on CUDA). probs may be null.
void MoeRoutesToHost(const MoeActivations& a, std::vector<int32_t>* routes,
                     std::vector<int32_t>* recomputed, std::vector<float>* probs);

}  // namespace prl
