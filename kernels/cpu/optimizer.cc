// CPU optimizer kernels: element-wise, split across the OpenMP threads in fixed chunks (each
// element's arithmetic is independent of the split, so results do not depend on the thread
// count).
#include "kernels/optimizer.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"

namespace prl::kernels::cpu {

void AdamWUpdate(float* p, const float* g, float* m, float* v, int64_t n, bool decay,
                 const AdamWStep& s) {
  const double bc1 = 1.0 - std::pow(static_cast<double>(s.beta1), static_cast<double>(s.step));
  const double bc2 = 1.0 - std::pow(static_cast<double>(s.beta2), static_cast<double>(s.step));
  // torch.optim.AdamW (foreach=False): step_size = lr / bc1, denom = sqrt(v) / sqrt(bc2) + eps.
  const float step_size = static_cast<float>(s.lr / bc1);
  const float inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(bc2));
  const float decay_factor = decay ? 1.0f - s.lr * s.weight_decay : 1.0f;
  const float b1 = s.beta1, b2 = s.beta2, eps = s.eps, scale = s.grad_scale;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float gi = g[i] * scale;
    p[i] *= decay_factor;
    m[i] = b1 * m[i] + (1.0f - b1) * gi;
    v[i] = b2 * v[i] + (1.0f - b2) * gi * gi;
    const float denom = std::sqrt(v[i]) * inv_sqrt_bc2 + eps;
    p[i] -= step_size * m[i] / denom;
  }
}

void SgdUpdate(float* p, const float* g, int64_t n, float weight_decay, float lr,
               float grad_scale) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) p[i] -= lr * (grad_scale * g[i] + weight_decay * p[i]);
}

void AddInPlace(float* dst, const float* src, int64_t n) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) dst[i] += src[i];
}

double SumOfSquares(const float* x, int64_t n) {
  // Fixed 4096-element blocks summed in order: the same result for any thread count.
  constexpr int64_t kBlock = 4096;
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  std::vector<double> partial(static_cast<size_t>(blocks), 0.0);
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < blocks; ++b) {
    double s = 0;
    for (int64_t i = b * kBlock; i < std::min(n, (b + 1) * kBlock); ++i) {
      s += static_cast<double>(x[i]) * x[i];
    }
    partial[b] = s;
  }
  double total = 0;
  for (double s : partial) total += s;
  return total;
}

}  // namespace prl::kernels::cpu
