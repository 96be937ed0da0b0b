// Qwen3-MoE's routing and row movement on CUDA (kernels/moe.h dispatches here; model/moe_layer.h
// has the math): the router's softmax and top-k with ties to the lower id, replayed routes and
// renormalisation; a stable counting sort of the (token, k) pairs by expert on the device; the
// row gather; the weighted combine and its backward; the router's backward; the scatter of the
// experts' input gradients back to their tokens. Each output element is computed by one thread
// (or one block) in a fixed order, so the results do not depend on the batch around a token.
//
// MoeGroupedGemm is the experts' GEMM with the row ranges on the device (a CUDA graph could
// capture it); model/moe_layer.cc runs each expert's range through cuBLASLt instead (much
// faster at the learner's sizes), reading the ranges on the host. Verified against host
// references by tests/kernels/cuda_moe_test.cc.
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace prl::kernels::cuda {

// Per token t (T tokens): probs (T, E) F32 = softmax(logits (T, E) F32) (probs may be logits:
// in place); recomputed (T, K) I32 = the K largest, ties to the lower id; routes (T, K) I32 =
// forced[t] where forced is non-null and forced[t K] >= 0 (a replayed row), else recomputed[t];
// weights (T, K) F32 = probs at routes, divided by their sum iff renormalise. E <= 256.
void MoeRoute(int device, float* probs, int32_t* recomputed, int32_t* routes, float* weights,
              const float* logits, const int32_t* forced, int64_t T, int64_t E, int64_t K,
              bool renormalise);

// A stable counting sort of the N = T K pairs by routes[i] (E experts): expert_begin (E + 1),
// row_of (N) (pair i's row), token_of (N) (row r's token, i / K). Within an expert the rows
// keep pair order, exactly as model/moe_layer.h's CPU sort. One block.
void MoeSortByExpert(int device, int32_t* expert_begin, int32_t* row_of, int32_t* token_of,
                     const int32_t* routes, int64_t N, int64_t K, int64_t E);

// x (N, C) [row r] = in (T, C) [token_of[r]], storage dt.
void MoeGatherRows(int device, DType dt, void* x, const void* in, const int32_t* token_of,
                   int64_t N, int64_t C);

// For every expert e: out rows [begin[e], begin[e + 1]) (Nout wide) = a rows of the same range
// (Kdim wide) . w_e^T, w the (E, Nout, Kdim) stack; fp32 accumulation in a fixed order of Kdim
// (batch-invariant), storage dt. max_rows bounds every expert's row count (the grid's height).
void MoeGroupedGemm(int device, DType dt, void* out, const void* a, const void* w,
                    const int32_t* expert_begin, int64_t E, int64_t max_rows, int64_t Nout,
                    int64_t Kdim);

// out (T, C) [t] = residual[t] + sum_k weights[t, k] y[row_of[t K + k]] (k in order).
void MoeCombine(int device, DType dt, void* out, const void* residual, const void* y,
                const float* weights, const int32_t* row_of, int64_t T, int64_t K, int64_t C);

// MoeCombine's backward: dy[row_of[t K + k]] = weights[t, k] dout[t] (storage dt);
// dweights (T, K) F32 [t, k] = <dout[t], y[row_of[t K + k]]>, summed in double.
void MoeCombineBackward(int device, DType dt, void* dy, float* dweights, const void* dout,
                        const void* y, const float* weights, const int32_t* row_of, int64_t T,
                        int64_t K, int64_t C);

// dlogits (T, E) F32 from dweights (T, K) F32 through weights = probs[routes] (/ their sum iff
// renormalise) and probs = softmax(logits); aux_dprobs (E) F32 or null, added to every token's
// gradient at probs. Double arithmetic per token, as the CPU's.
void MoeRouterBackward(int device, float* dlogits, const float* probs, const int32_t* routes,
                       const float* weights, const float* dweights, const float* aux_dprobs,
                       int64_t T, int64_t E, int64_t K, bool renormalise);

// dx (T, C) [t] += sum_k dxs[row_of[t K + k]], added in k order in fp32.
void MoeScatterAddRows(int device, DType dt, void* dx, const void* dxs, const int32_t* row_of,
                       int64_t T, int64_t K, int64_t C);

}  // namespace prl::kernels::cuda
