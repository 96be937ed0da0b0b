// Language-model head fused with log-softmax and target gather, chunked over rows.
//
// The (R, V) logits of a whole batch can be gigabytes (V = 152k for Qwen2), so they exist only
// chunk_rows at a time; the backward recomputes each chunk rather than storing it. Row sums
// of exponentials are accumulated in blocks, then in double (vec_math.h): V terms in one fp32
// accumulator would lose ~log2(V) bits.
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/vec_math.h"

namespace prl::kernels::cpu {

namespace {

// z (rows, V) = (h (rows, C) . W^T) * (1 / temperature): the logits first, then the sampler's
// exact scaling (sampling.cc), so that learner and sampler see the same z bits.
void ScaledLogits(float* z, const float* h, const float* W, int64_t rows, int64_t V, int64_t C,
                  float temperature, bool invariant) {
  if (invariant) {
    MatmulForwardInvariant(z, h, W, nullptr, rows, V, C, /*accumulate=*/false);
  } else {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, V, C, 1.0f, h, C, W, C, 0.0f, z, V);
  }
  if (temperature == 1.0f) return;
  const float inv_temperature = 1.0f / temperature;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < rows * V; ++i) z[i] *= inv_temperature;
}

}  // namespace

void LogprobForward(float* logprob, float* lse, const float* h, const float* W,
                    const int32_t* targets, int64_t R, int64_t V, int64_t C, float temperature,
                    float* scratch, int64_t chunk_rows, bool invariant, float* entropy) {
  for (int64_t r0 = 0; r0 < R; r0 += chunk_rows) {
    const int64_t rows = std::min(chunk_rows, R - r0);
    ScaledLogits(scratch, h + r0 * C, W, rows, V, C, temperature, invariant);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < rows; ++i) {
      float* z = scratch + i * V;
      const float row_lse = RowLogSumExp(z, V);
      lse[r0 + i] = row_lse;
      logprob[r0 + i] = z[targets[r0 + i]] - row_lse;
      if (entropy != nullptr) {  // H = lse - E_p[z]
        entropy[r0 + i] = static_cast<float>(row_lse - SoftmaxMean(z, V, row_lse));
      }
    }
  }
}

void LogprobBackward(float* dh, float* dW, const float* dlogprob, const float* h, const float* W,
                     const int32_t* targets, const float* lse, int64_t R, int64_t V, int64_t C,
                     float temperature, float* scratch, int64_t chunk_rows, bool invariant,
                     bool logits_kept) {
  const float inv_temperature = 1.0f / temperature;
  for (int64_t r0 = 0; r0 < R; r0 += chunk_rows) {
    const int64_t rows = std::min(chunk_rows, R - r0);
    if (!logits_kept) ScaledLogits(scratch, h + r0 * C, W, rows, V, C, temperature, invariant);
    // d logprob / d logits = (onehot(target) - softmax(z)) / temperature.
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < rows; ++i) {
      float* z = scratch + i * V;
      const float row_lse = lse[r0 + i];
      const float g = dlogprob[r0 + i] * inv_temperature;
      ScaledExp(z, z, V, row_lse, -g);
      z[targets[r0 + i]] += g;
    }
    // dh = dlogits . W;  dW += dlogits^T . h
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, C, V, 1.0f, scratch, V, W, C, 0.0f,
                dh + r0 * C, C);
    if (dW != nullptr) {  // else a frozen LM head
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, V, C, rows, 1.0f, scratch, V,
                  h + r0 * C, C, 1.0f, dW, C);
    }
  }
}

}  // namespace prl::kernels::cpu
