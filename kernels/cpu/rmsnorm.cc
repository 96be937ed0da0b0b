// RMSNorm (Hugging Face LlamaRMSNorm / Qwen2RMSNorm), fp32.
#include <algorithm>
#include <cmath>

#include "kernels/cpu/cpu_kernels.h"

namespace prl::kernels::cpu {

void RmsNormForward(float* y, float* rstd, const float* x, const float* w, int64_t T, int64_t C,
                    float eps) {
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < T; ++t) {
    const float* xr = x + t * C;
    float* yr = y + t * C;
    float sum_sq = 0.0f;
    for (int64_t c = 0; c < C; ++c) sum_sq += xr[c] * xr[c];
    const float r = 1.0f / std::sqrt(sum_sq / static_cast<float>(C) + eps);
    rstd[t] = r;
    for (int64_t c = 0; c < C; ++c) yr[c] = w[c] * (xr[c] * r);
  }
}

void RmsNormBackward(float* dx, float* dw, const float* dy, const float* x, const float* w,
                     const float* rstd, int64_t T, int64_t C) {
  // y = w * xhat, xhat = x * r, r = (mean(x^2) + eps)^-1/2.
  // dx = r * (w*dy - xhat * mean(w*dy*xhat)).
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < T; ++t) {
    const float* xr = x + t * C;
    const float* dyr = dy + t * C;
    float* dxr = dx + t * C;
    const float r = rstd[t];
    float dot = 0.0f;
    for (int64_t c = 0; c < C; ++c) dot += w[c] * dyr[c] * xr[c];
    const float mean_term = dot * r * r / static_cast<float>(C);
    for (int64_t c = 0; c < C; ++c) dxr[c] += r * (w[c] * dyr[c] - xr[c] * mean_term);
  }
  // dw[c] = sum_t dy[t,c] * xhat[t,c]; column blocks keep the threads' writes disjoint.
  if (dw == nullptr) return;  // a frozen norm weight
  constexpr int64_t kBlock = 64;
#pragma omp parallel for schedule(static)
  for (int64_t c0 = 0; c0 < C; c0 += kBlock) {
    const int64_t c1 = std::min(C, c0 + kBlock);
    float acc[kBlock] = {};
    for (int64_t t = 0; t < T; ++t) {
      const float r = rstd[t];
      const float* xr = x + t * C;
      const float* dyr = dy + t * C;
      for (int64_t c = c0; c < c1; ++c) acc[c - c0] += dyr[c] * xr[c] * r;
    }
    for (int64_t c = c0; c < c1; ++c) dw[c] += acc[c - c0];
  }
}

}  // namespace prl::kernels::cpu
