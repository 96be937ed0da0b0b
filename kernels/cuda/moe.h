// Qwen3-MoE's grouped-expert kernels on CUDA (model/moe_layer.h has the math): routing (softmax,
// top-k with ties to the lower id, renormalisation), the row gather, a grouped GEMM over the
// experts' contiguous row ranges, and the weighted combine.
//
// Status: written and compiled (build-cuda-check), not yet run on a GPU; nothing calls them.
// tests/kernels/cuda_moe_test.cc checks each against a host reference when a GPU runs it.
// MoeCudaKernelsEnabled() is the setting that will route model/moe_layer.cc here; it is
// off, and a Transformer or Engine on CUDA with a MoE model is refused, until a GPU session
// checks these against the CPU backend (the routes bit for bit in the batch-invariant mode).
// The host side still has to sort the (token, k) pairs by expert (the CPU's counting sort, on
// the device) before MoeGroupedGemm can run without a host round trip.
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace prl::kernels::cuda {

// Off until verified on a GPU (see above). Process-wide.
bool MoeCudaKernelsEnabled();

// Per token t (T tokens): probs (T, E) F32 = softmax(logits (T, E) F32); routes (T, K) I32 =
// the K largest, ties to the lower id (as model/moe_layer.cc); weights (T, K) F32 = their
// probabilities, divided by their sum iff renormalise. E <= 256.
void MoeRoute(int device, float* probs, int32_t* routes, float* weights, const float* logits,
              int64_t T, int64_t E, int64_t K, bool renormalise);

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

}  // namespace prl::kernels::cuda
