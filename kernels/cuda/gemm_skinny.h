// Skinny GEMMs on the GPU: D (M, N) = A (M, K) . B (N, K)^T [+ beta C] [+ bias] for M <= 8 rows
// of BF16 activations against BF16 weights, the shape of every projection in a small decode
// step (kernels/cuda/gemm_skinny.cu). cuBLASLt's tensor-core tiles are 64+ rows tall, so at one
// to eight rows they read the weights at a fraction of the memory bandwidth; here one warp reads
// one weight row with 16-byte loads and keeps all M dot products in registers, so a step is
// bound by reading the weights once.
//
// Process-wide and off by default (SetSkinnyGemm; the engine's tuned kernels turn it on for the
// fast order): cuda::Gemm (kernels/cuda/gemm.h) then routes the shapes SkinnyGemmSupported
// accepts here. The summation order differs from cuBLASLt's (each lane sums its slice of K in
// fp32, then the warp's lanes are added by shuffles): results agree within the dtype's rounding,
// not bit for bit.
#pragma once

#include <cuda_runtime.h>

#include "kernels/cuda/gemm.h"

namespace prl::kernels::cuda {

inline constexpr int64_t kSkinnyGemmMaxRows = 8;

void SetSkinnyGemm(bool on);
bool SkinnyGemm();

// A not transposed, B transposed (Hugging Face's (out, in) weights), BF16 A and B, D (and C, and
// the bias) BF16 or F32, dense rows (lda = ldb = K, ldd = N), M <= kSkinnyGemmMaxRows, K a
// multiple of 8, alpha 1, beta 0 or 1, 16-byte aligned A and B.
bool SkinnyGemmSupported(const GemmArgs& args);

// Requires SkinnyGemmSupported; asynchronous on `stream`, capturable in a CUDA graph.
void SkinnyGemmRun(int device, cudaStream_t stream, const GemmArgs& args);

// The same product of RMSNorm(a; norm_weight, eps) instead of a (kernels/norm_matmul.h): the
// norm's weight (K, BF16) multiplies each activation as it is read, and each output row is
// scaled by rsqrt(mean(a_row^2) + eps) after its dot product (before the bias). Not governed by
// SetSkinnyGemm (the caller chooses it). Supported: SkinnyGemmSupported, beta 0, the norm's
// weight 16-byte aligned.
bool SkinnyNormGemmSupported(const GemmArgs& args, const void* norm_weight);
void SkinnyNormGemmRun(int device, cudaStream_t stream, const GemmArgs& args,
                       const void* norm_weight, float eps);

}  // namespace prl::kernels::cuda
