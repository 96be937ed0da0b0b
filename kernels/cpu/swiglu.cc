// SwiGLU MLP activation: act = silu(gate) * up.
#include <cmath>

#include "kernels/cpu/cpu_kernels.h"

namespace prl::kernels::cpu {

void SwiGluForward(float* act, const float* gate_up, int64_t T, int64_t I) {
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < T; ++t) {
    const float* g = gate_up + t * 2 * I;
    const float* u = g + I;
    float* a = act + t * I;
    for (int64_t i = 0; i < I; ++i) {
      const float sig = 1.0f / (1.0f + std::exp(-g[i]));
      a[i] = g[i] * sig * u[i];
    }
  }
}

void SwiGluBackward(float* dgate_up, const float* dact, const float* gate_up, int64_t T,
                    int64_t I) {
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < T; ++t) {
    const float* g = gate_up + t * 2 * I;
    const float* u = g + I;
    const float* da = dact + t * I;
    float* dg = dgate_up + t * 2 * I;
    float* du = dg + I;
    for (int64_t i = 0; i < I; ++i) {
      const float sig = 1.0f / (1.0f + std::exp(-g[i]));
      const float silu = g[i] * sig;
      // d silu / dg = sig * (1 + g * (1 - sig))
      dg[i] = da[i] * u[i] * sig * (1.0f + g[i] * (1.0f - sig));
      du[i] = da[i] * silu;
    }
  }
}

}  // namespace prl::kernels::cpu
