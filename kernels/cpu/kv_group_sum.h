// The attention backwards' last step (attention.cc, context_attention.cc): each KV head's key and
// value gradients, the sum of its group's query heads' (kept per head so that threads never
// share a row), in ascending head order so that the result does not depend on thread timing.
#pragma once

#include <cstdint>

namespace prl::kernels::cpu {

// For rows t < rows: out[t * stride + k_col + g D + d] (+)= sum over query heads h of KV head g
// of dk_heads[(h rows + t) D + d], and the same for the values at v_col. Runs as an OpenMP
// work-shared loop: call it inside a parallel region, from every thread.
inline void SumKvGroupGrads(float* out, int64_t stride, int64_t k_col, int64_t v_col,
                            const float* dk_heads, const float* dv_heads, int64_t rows, int64_t H,
                            int64_t KV, int64_t D, bool accumulate) {
  const int64_t group = H / KV;
#pragma omp for schedule(static)
  for (int64_t t = 0; t < rows; ++t) {
    for (int64_t g = 0; g < KV; ++g) {
      float* dk_out = out + t * stride + k_col + g * D;
      float* dv_out = out + t * stride + v_col + g * D;
      for (int64_t d = 0; d < D; ++d) {
        float sk = 0.0f, sv = 0.0f;
        for (int64_t j = 0; j < group; ++j) {
          const int64_t h = g * group + j;
          sk += dk_heads[(h * rows + t) * D + d];
          sv += dv_heads[(h * rows + t) * D + d];
        }
        dk_out[d] = accumulate ? dk_out[d] + sk : sk;
        dv_out[d] = accumulate ? dv_out[d] + sv : sv;
      }
    }
  }
}

}  // namespace prl::kernels::cpu
