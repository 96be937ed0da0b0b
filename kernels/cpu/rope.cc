// Rotary position embedding, Hugging Face rotate_half convention.
#include <cmath>

#include "kernels/cpu/cpu_kernels.h"

namespace prl::kernels::cpu {

void RopeTables(float* cos, float* sin, const int32_t* positions, const float* inv_freq, int64_t T,
                int64_t half_dim) {
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < T; ++t) {
    const float p = static_cast<float>(positions[t]);
    for (int64_t i = 0; i < half_dim; ++i) {
      const float angle = p * inv_freq[i];  // fp32 product, as in transformers
      cos[t * half_dim + i] = static_cast<float>(std::cos(static_cast<double>(angle)));
      sin[t * half_dim + i] = static_cast<float>(std::sin(static_cast<double>(angle)));
    }
  }
}

void RopeApply(float* x, int64_t T, int64_t num_heads, int64_t D, int64_t row_stride,
               const float* cos, const float* sin, bool inverse) {
  const int64_t half = D / 2;
  const float sign = inverse ? -1.0f : 1.0f;
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < T; ++t) {
    const float* c = cos + t * half;
    const float* s = sin + t * half;
    for (int64_t h = 0; h < num_heads; ++h) {
      float* v = x + t * row_stride + h * D;
      for (int64_t i = 0; i < half; ++i) {
        const float x1 = v[i];
        const float x2 = v[i + half];
        const float si = sign * s[i];
        v[i] = x1 * c[i] - x2 * si;
        v[i + half] = x2 * c[i] + x1 * si;
      }
    }
  }
}

}  // namespace prl::kernels::cpu
