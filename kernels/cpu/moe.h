// The CPU backend of kernels/moe.h (F32 activations; the contracts are there).
#pragma once

#include <cstdint>

namespace prl::kernels::cpu {

void MoeRoute(float* probs, int32_t* recomputed, int32_t* routes, float* weights,
              const float* logits, const int32_t* forced, int64_t T, int64_t E, int64_t K,
              bool renormalise);
void MoeSortByExpert(int32_t* expert_begin, int32_t* row_of, int32_t* token_of,
                     const int32_t* routes, int64_t N, int64_t K, int64_t E);
void MoeGatherRows(float* x, const float* in, const int32_t* token_of, int64_t N, int64_t C);
void MoeCombine(float* out, const float* residual, const float* y, const float* weights,
                const int32_t* row_of, int64_t T, int64_t K, int64_t C);
void MoeCombineBackward(float* dy, float* dweights, const float* dout, const float* y,
                        const float* weights, const int32_t* row_of, int64_t T, int64_t K,
                        int64_t C);
void MoeRouterBackward(float* dlogits, const float* probs, const int32_t* routes,
                       const float* weights, const float* dweights, const float* aux_dprobs,
                       int64_t T, int64_t E, int64_t K, bool renormalise);
void MoeScatterAddRows(float* dx, const float* dxs, const int32_t* row_of, int64_t T, int64_t K,
                       int64_t C);

}  // namespace prl::kernels::cpu
