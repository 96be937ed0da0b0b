// Batch-invariant GEMM: out = a . w^T where every output element is one fixed sequence of
// operations on its own row of `a` and row of `w`: 8-lane partial sums over k in steps of 8
// (the K tail zero-padded), then a fixed horizontal sum. No element depends on M, on which
// micro-kernel or thread computed it, or on the other rows, so a token's activations are the
// same bits whether it is decoded alone, in a batch of 64, in a prefill chunk, or in the
// learner's packed batch. OpenBLAS gives none of that (its edge and small-matrix kernels sum in
// other orders). The price is speed: a register-blocked dot-product kernel without packing,
// roughly a third of OpenBLAS here.
#include <algorithm>
#include <cstring>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/invariant_dot.h"

namespace prl::kernels::cpu {

namespace {
constexpr int64_t kRowTile = 4;     // rows of a per micro-kernel
constexpr int64_t kColTile = 2;     // rows of w per micro-kernel
constexpr int64_t kColBlock = 128;  // rows of w kept hot in L2 while all row tiles pass
}  // namespace

void MatmulForwardInvariant(float* out, const float* a, const float* w, const float* bias,
                            int64_t M, int64_t N, int64_t K, bool accumulate) {
  const int64_t row_tiles = (M + kRowTile - 1) / kRowTile;
  const int64_t col_blocks = (N + kColBlock - 1) / kColBlock;
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t cb = 0; cb < col_blocks; ++cb) {
    for (int64_t rt = 0; rt < row_tiles; ++rt) {
      const int64_t m0 = rt * kRowTile, m1 = std::min(M, m0 + kRowTile);
      const int64_t n0 = cb * kColBlock, n1 = std::min(N, n0 + kColBlock);
      float tile[kRowTile * kColBlock];
      const int64_t width = n1 - n0;
      for (int64_t n = n0; n < n1; n += kColTile) {
        float* t = tile + (n - n0);
        const float* wn = w + n * K;
        const float* am = a + m0 * K;
        const bool full_rows = m1 - m0 == kRowTile, full_cols = n + kColTile <= n1;
        if (full_rows && full_cols) {
          DotMicroKernel<kRowTile, kColTile>(t, kColBlock, am, K, wn, K, K);
        } else {
          for (int64_t m = m0; m < m1; ++m) {
            for (int64_t c = n; c < std::min(n1, n + kColTile); ++c) {
              DotMicroKernel<1, 1>(tile + (m - m0) * kColBlock + (c - n0), 1, a + m * K, K,
                                   w + c * K, K, K);
            }
          }
        }
      }
      for (int64_t m = m0; m < m1; ++m) {
        float* dst = out + m * N + n0;
        const float* src = tile + (m - m0) * kColBlock;
        for (int64_t j = 0; j < width; ++j) {
          const float v = bias != nullptr ? src[j] + bias[n0 + j] : src[j];
          dst[j] = accumulate ? dst[j] + v : v;
        }
      }
    }
  }
}

}  // namespace prl::kernels::cpu
