// Token embedding lookup and its scatter-add backward.
#include <algorithm>
#include <cstring>

#include "kernels/cpu/cpu_kernels.h"

namespace prl::kernels::cpu {

void EmbeddingForward(float* out, const float* table, const int32_t* tokens, int64_t T, int64_t C) {
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < T; ++t) {
    std::memcpy(out + t * C, table + static_cast<int64_t>(tokens[t]) * C, C * sizeof(float));
  }
}

void EmbeddingBackward(float* dtable, const float* dout, const int32_t* tokens, int64_t T,
                       int64_t C) {
  // Repeated tokens hit the same row, so threads split the columns, not the tokens.
  constexpr int64_t kBlock = 64;
#pragma omp parallel for schedule(static)
  for (int64_t c0 = 0; c0 < C; c0 += kBlock) {
    const int64_t c1 = std::min(C, c0 + kBlock);
    for (int64_t t = 0; t < T; ++t) {
      float* dst = dtable + static_cast<int64_t>(tokens[t]) * C;
      const float* src = dout + t * C;
      for (int64_t c = c0; c < c1; ++c) dst[c] += src[c];
    }
  }
}

}  // namespace prl::kernels::cpu
