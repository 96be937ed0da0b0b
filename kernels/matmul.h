// Linear layers: y = x W^T (+ b), with W in Hugging Face's (out_features, in_features) layout.
//
// Dtypes: the CPU takes F32. On CUDA out, a, w, bias, da and dout share one dtype, F32 (the
// exact mode) or BF16, through cuBLASLt with fp32 compute (never TF32); dw is F32 or that
// dtype, dbias F32; a BF16 forward may write an F32 out (the LM head's logits). BF16 operands
// reach the tensor cores when rows are multiples of 8 elements and pointers 16-byte aligned
// (kernels/cuda/gemm.h); other shapes work, more slowly. The batch-invariant order has its own
// kernels on both backends; on CUDA it runs on the CUDA cores (kernels/cuda/gemm_invariant.cu).
#pragma once

#include "core/tensor.h"
#include "kernels/reduction_order.h"

namespace prl::kernels {

// out (M, N) = a (M, K) . w (N, K)^T + bias (N, optional); with accumulate, out += that.
// Accumulating lets a residual connection be fused into the projection that feeds it.
// order = kBatchInvariant makes each output element independent of M (reduction_order.h).
void MatmulForward(const Tensor& out, const Tensor& a, const Tensor& w, const Tensor& bias = {},
                   bool accumulate = false, ReductionOrder order = ReductionOrder::kFast);

// out (M, N) = residual (M, N) + a (M, K) . w (N, K)^T: a residual connection fused into the
// projection that feeds it. On CUDA's fast order cuBLASLt reads the residual as its C operand,
// so nothing is copied (out may also be residual itself); elsewhere the residual is copied into
// out and the product accumulated, which MatmulForward(accumulate) does in the same order.
void MatmulResidualForward(const Tensor& out, const Tensor& a, const Tensor& w,
                           const Tensor& residual, ReductionOrder order = ReductionOrder::kFast);

// CUDA, fast order: each new GEMM plan takes the fastest of several of cuBLASLt's algorithms,
// timed once, instead of its heuristic's first (process-wide; kernels/cuda/gemm.h says what a
// timed choice costs in reproducibility). No effect on the CPU.
void SetGemmAlgorithmSearch(bool on);
bool GemmAlgorithmSearch();
// CUDA, fast order: BF16 products of at most 8 rows (a small decode step's projections) run
// on a kernel that reads the weights at memory bandwidth instead of cuBLASLt's tall tiles
// (process-wide; kernels/cuda/gemm_skinny.h). No effect on the CPU.
void SetSkinnyGemm(bool on);
// CUDA, batch-invariant order, BF16: the products on the tensor cores through one pinned
// cuBLASLt algorithm per shape instead of the CUDA-core kernel (kernels/cuda/gemm.h;
// process-wide, for the engine and the learner of one process alike). On by default since an
// H200 showed that it keeps every row's bits whatever the batch; `prl generate|score|bench
// engine --no-invariant-tensor-cores` turn it off. No effect on the CPU (false there).
void SetTensorCoreInvariantGemm(bool on);
bool TensorCoreInvariantGemm();

// da (M, K) = dout . w (skipped if undefined); dw (N, K) += dout^T . a (skipped if undefined:
// a frozen weight); dbias (N) += column sums of dout (skipped if undefined).
void MatmulBackward(const Tensor& da, const Tensor& dw, const Tensor& dbias, const Tensor& dout,
                    const Tensor& a, const Tensor& w);

}  // namespace prl::kernels
