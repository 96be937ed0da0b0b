// The RMSNorm fused into the projection that reads it: out (M, N) = RMSNorm(x; g, eps) (M, K) .
// w (N, K)^T + bias (N, optional), the normalised rows never written. For a small decode step's
// QKV and gate|up projections (model/decoder_layer.cc, LayerContext::norm_in_gemm): at one to
// eight rows a projection reads its weights once, and RMSNorm would be a kernel of its own (49
// per step of a 24-layer model, a few microseconds each at batch 1).
//
// Only where NormMatmulSupported says: CUDA, the fast order, BF16 x, g and w, M <= 8 and the
// skinny GEMM's other conditions (kernels/cuda/gemm_skinny.h); elsewhere the caller runs
// RmsNormForward, then MatmulForward (the same math). The fused sum of squares is fp32 over the
// BF16 x and each row's dot products are scaled by rsqrt(mean + eps) after the sum, so the
// results are not the unfused path's bits (which rounds the normalised rows to BF16 first);
// they agree within BF16's tolerance (tests/kernels/cuda_tuned_kernels_test.cc).
//
// Status: verified on an H200 (cuda_kernels_test's NormInGemmMatchesCpuRmsNormThenMatmul,
// cuda_engine_test's NormInGemmKeepsTheTunedKernelsAgreementWithTheLearner). Timed there with
// the tuned kernels (Qwen2.5-0.5B shape, docs/benchmarks.md): 1.15x decode at batch 1, 0.94x
// at batch 8, so the engine fuses only steps of kNormInGemmMaxRows rows
// (EngineOptions::norm_in_gemm, actors.norm_in_gemm, on).
#pragma once

#include <cstdint>

#include "core/tensor.h"
#include "kernels/reduction_order.h"

namespace prl::kernels {

// The most rows a step fuses (the callers' rule; NormMatmulSupported allows up to 8).
inline constexpr int64_t kNormInGemmMaxRows = 1;

bool NormMatmulSupported(const Tensor& out, const Tensor& x, const Tensor& g, const Tensor& w,
                         const Tensor& bias, ReductionOrder order);

// Requires NormMatmulSupported (checked: a programming error otherwise).
void NormMatmulForward(const Tensor& out, const Tensor& x, const Tensor& g, float eps,
                       const Tensor& w, const Tensor& bias = {});

}  // namespace prl::kernels
