// SwiGLU MLP activation: act = silu(gate) * up.
#include <algorithm>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/vec_math.h"

namespace prl::kernels::cpu {

void SwiGluForward(float* act, const float* gate_up, int64_t T, int64_t I) {
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < T; ++t) {
    const float* g = gate_up + t * 2 * I;
    const float* u = g + I;
    float* a = act + t * I;
    for (int64_t i = 0; i < I; i += kVec) {
      const int64_t n = std::min(kVec, I - i);
      const F8 gv = n == kVec ? Load8(g + i) : LoadPartial(g + i, n, 0.0f);
      const F8 uv = n == kVec ? Load8(u + i) : LoadPartial(u + i, n, 0.0f);
      const F8 out = gv * Sigmoid8(gv) * uv;
      n == kVec ? Store8(a + i, out) : StorePartial(a + i, n, out);
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
    for (int64_t i = 0; i < I; i += kVec) {
      const int64_t n = std::min(kVec, I - i);
      const F8 gv = n == kVec ? Load8(g + i) : LoadPartial(g + i, n, 0.0f);
      const F8 uv = n == kVec ? Load8(u + i) : LoadPartial(u + i, n, 0.0f);
      const F8 dav = n == kVec ? Load8(da + i) : LoadPartial(da + i, n, 0.0f);
      const F8 sig = Sigmoid8(gv);
      // d silu / dg = sig * (1 + g * (1 - sig))
      const F8 dgv = dav * uv * sig * (1.0f + gv * (1.0f - sig));
      const F8 duv = dav * gv * sig;
      if (n == kVec) {
        Store8(dg + i, dgv);
        Store8(du + i, duv);
      } else {
        StorePartial(dg + i, n, dgv);
        StorePartial(du + i, n, duv);
      }
    }
  }
}

}  // namespace prl::kernels::cpu
