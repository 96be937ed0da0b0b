// CPU GEMMs for linear layers (y = x W^T, HF's (out, in) weight layout) via OpenBLAS.
#include <cblas.h>

#include <algorithm>

#include "kernels/cpu/cpu_kernels.h"

namespace prl::kernels::cpu {

namespace {
constexpr int64_t kUnpackedBelowRows = 8;
}  // namespace

void MatmulForward(float* out, const float* a, const float* w, const float* bias, int64_t M,
                   int64_t N, int64_t K, bool accumulate) {
  // A handful of rows (decoding a small batch): OpenBLAS repacks all of w for every call and
  // runs 2-3x slower than the unpacked dot-product kernel, which reads w once.
  if (M < kUnpackedBelowRows) {
    return MatmulForwardInvariant(out, a, w, bias, M, N, K, accumulate);
  }
  float beta = accumulate ? 1.0f : 0.0f;
  if (bias != nullptr) {
    // Seed the output with the bias (or add it) and let the GEMM accumulate on top.
#pragma omp parallel for schedule(static)
    for (int64_t m = 0; m < M; ++m) {
      float* row = out + m * N;
      if (accumulate) {
        for (int64_t n = 0; n < N; ++n) row[n] += bias[n];
      } else {
        for (int64_t n = 0; n < N; ++n) row[n] = bias[n];
      }
    }
    beta = 1.0f;
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1.0f, a, K, w, K, beta, out, N);
}

void MatmulBackward(float* da, float* dw, float* dbias, const float* dout, const float* a,
                    const float* w, int64_t M, int64_t N, int64_t K) {
  if (da != nullptr) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, K, N, 1.0f, dout, N, w, K, 0.0f, da,
                K);
  }
  if (dw != nullptr) {
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, N, K, M, 1.0f, dout, N, a, K, 1.0f, dw, K);
  }
  if (dbias != nullptr) {
    // Column sums: each thread owns a block of columns, so no two threads write one element.
    constexpr int64_t kBlock = 64;
#pragma omp parallel for schedule(static)
    for (int64_t n0 = 0; n0 < N; n0 += kBlock) {
      const int64_t n1 = std::min(N, n0 + kBlock);
      float acc[kBlock] = {};
      for (int64_t m = 0; m < M; ++m) {
        const float* row = dout + m * N;
        for (int64_t n = n0; n < n1; ++n) acc[n - n0] += row[n];
      }
      for (int64_t n = n0; n < n1; ++n) dbias[n] += acc[n - n0];
    }
  }
}

}  // namespace prl::kernels::cpu
