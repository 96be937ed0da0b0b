// GEMMs through cuBLASLt, row-major, fp32 compute (CUBLAS_COMPUTE_32F, never TF32, so the
// fp32 mode matches the CPU backend).
//
// Row-major D (M, N) = alpha * op(A) . op(B) + beta * D (+ bias (N) broadcast over rows when
// bias != nullptr; bias has D's dtype). op(A) is (M, K): A is stored (M, K) with row stride
// lda, or (K, M) when trans_a. op(B) is (K, N): B is stored (K, N) with row stride ldb, or
// (N, K) when trans_b (the nn.Linear weight case). A and B share a dtype (F32 or BF16); D is
// F32 or BF16 (BF16 inputs may write an F32 D, e.g. weight gradients). beta = 1 accumulates.
// With c set, D = alpha * op(A) . op(B) + beta * C: C (M, N) has D's dtype and row stride and
// may be another buffer than D (a residual added without a copy) or D itself (c == d).
//
// Alignment: any pointer and row stride work (the heuristic is asked for an algorithm that
// accepts the operands' actual alignment), but BF16 tensor-core kernels want every pointer
// 16-byte aligned and every row stride a multiple of 8 elements; odd strides fall back to
// slower kernels. M, N, K may be anything >= 1 (M == 0 or N == 0 is a no-op).
//
// Implementation: one cuBLASLt handle per device; per calling thread, the plans (descriptors
// and the chosen algorithm, cached per shape, dtypes, transposes, strides, bias and
// alignment) and one 32 MiB workspace per (device, stream), from the caching allocator and
// kept until the thread exits (so two streams never share a workspace). Runs asynchronously
// on `stream`; failures abort naming the cuBLASLt call, its status string, file and line.
// Thread-safe.
//
// Algorithm choice: the heuristic's first algorithm, or, with SetGemmAlgorithmSearch(true),
// the fastest of the heuristic's first kGemmSearchCandidates, timed once per plan on a scratch
// output (vLLM and PyTorch's TunableOp do the same). The search synchronises the stream once
// per new plan and is skipped while the stream is being captured into a CUDA graph (the
// heuristic's choice is kept then). A searched choice depends on timing, so two processes may
// pick different algorithms for one shape: results agree within the fast order's rounding,
// not bit for bit (the batch-invariant order never uses cuBLASLt).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/dtype.h"

namespace prl::kernels::cuda {

struct GemmArgs {
  bool trans_a = false, trans_b = false;
  int64_t M = 0, N = 0, K = 0;
  const void* a = nullptr;
  int64_t lda = 0;
  const void* b = nullptr;
  int64_t ldb = 0;
  void* d = nullptr;
  int64_t ldd = 0;
  DType ab_dtype = DType::kF32, d_dtype = DType::kF32;
  float alpha = 1, beta = 0;
  const void* bias = nullptr;
  const void* c = nullptr;  // the beta term's matrix; nullptr: d
};

void Gemm(int device, cudaStream_t stream, const GemmArgs& args);

// The arguments of a linear layer's product over dense rows: d (M, N) = a (M, K) . w (N, K)^T
// (beta 0, no bias; callers set those).
inline GemmArgs LinearGemmArgs(int64_t M, int64_t N, int64_t K, const void* a, const void* w,
                               void* d, DType ab_dtype, DType d_dtype) {
  GemmArgs g;
  g.trans_b = true;
  g.M = M;
  g.N = N;
  g.K = K;
  g.a = a;
  g.lda = K;
  g.b = w;
  g.ldb = K;
  g.d = d;
  g.ldd = N;
  g.ab_dtype = ab_dtype;
  g.d_dtype = d_dtype;
  return g;
}

// Process-wide: search for the fastest algorithm of each new plan (off: the heuristic's
// first). Plans made before a change keep their algorithm.
inline constexpr int kGemmSearchCandidates = 8;
void SetGemmAlgorithmSearch(bool on);
bool GemmAlgorithmSearch();

// The batch-invariant order on the tensor cores (on by default; SetTensorCoreInvariantGemm):
// one cuBLASLt algorithm per (N, K, strides, dtypes, transposes, bias, beta) — the heuristic's
// first for a reference of kPinnedReferenceRows rows, with split-K forced off — used for every
// M. A data-parallel kernel computes each output tile's K loop in the same order whatever M
// is, so a row's results would not depend on the rest of the batch. Whether cuBLASLt's kernels
// keep that promise (no M-dependent stream-K decomposition) is what cuda_kernels_test's
// PinnedAlgorithmGemmGivesARowTheSameBitsWhateverM checks; it passed on an H200, as did the
// engine's log-probs equal to the learner's bit for bit with it (cuda_engine_test), at
// 1.6-2.1x the CUDA-core invariant GEMMs' decode (docs/benchmarks.md). Every process of a run
// must agree (the default, on; `--no-invariant-tensor-cores` turns it off in the tools). Requires 16-byte aligned pointers, M, N, K >= 1; an M the
// pinned algorithm refuses is a programming error (PRL_CHECK naming the shape).
inline constexpr int64_t kPinnedReferenceRows = 512;
void SetTensorCoreInvariantGemm(bool on);
bool TensorCoreInvariantGemm();
bool PinnedAlgorithmGemmSupported(const GemmArgs& args);
void PinnedAlgorithmGemm(int device, cudaStream_t stream, const GemmArgs& args);

}  // namespace prl::kernels::cuda
