// The CUDA backend of the kernel library (kernels/*.h dispatch here for cuda:N tensors):
// raw-pointer kernels with fp32 accumulation over F32 or BF16 storage.
//
// Storage: "activation" operands of one call share a dtype `dt` (F32: the exact mode, for
// comparison with the CPU backend; BF16: the production mode). Statistics (rstd, lse,
// log-probs), optimizer state and master weights are always F32; index tensors are I32.
// Every kernel runs on the calling thread's current stream for the device (CurrentStream)
// and is asynchronous; errors abort with the CUDA call, file and line (PRL_CUDA_CHECK).
//
// What these are and are not: correct, fully-writing kernels with coalesced access, one block
// per row for the row-wise ops, cuBLASLt for every GEMM. Attention is a two-level kernel
// (a warp per query row and head, keys streamed with an online softmax; the backward a warp
// per key row and KV head, which sums over the group's query heads without atomics, so it is
// deterministic) — not yet a tensor-core FlashAttention; the CUDA issue's benchmarks measure
// what that costs.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/cuda/stream.h"
#include "core/dtype.h"
#include "kernels/cuda/gemm.h"
#include "kernels/sampling_row.h"

namespace prl::kernels::cuda {

// The calling thread's current stream for a device (core/cuda/stream.h; StreamGuard sets it).
using ::prl::cuda::CurrentStream;

// GEMM: kernels/cuda/gemm.h (Gemm, GemmArgs).

// Batch-invariant GEMM (kernels/cuda/gemm_invariant.cu): out (M, N) (out_dt: dt or F32)
// = [out +] a (M, K) . w (N, K)^T [+ bias (N, dt)], each element in a fixed order of K only.
void InvariantGemm(int device, DType dt, DType out_dt, void* out, const void* a, const void* w,
                   const void* bias, int64_t M, int64_t N, int64_t K, bool accumulate);

// --- Row-wise and element-wise ops (shapes as in the kernels/*.h dispatchers) --------------
void RmsNormForward(int device, DType dt, void* y, float* rstd, const void* x, const void* w,
                    int64_t T, int64_t C, float eps);
// dx (dt) += ; dw (F32, C) += (accumulated per column in fp32, deterministic); dw null: a frozen
// norm weight, its gradient not computed.
void RmsNormBackward(int device, DType dt, void* dx, float* dw, const void* dy, const void* x,
                     const void* w, const float* rstd, int64_t T, int64_t C);
// LoRA (kernels/convert.h): dst[t, j] = (accumulate ? dst[t, j] : 0) + alpha src[t, j] for
// t < T, j < width (dst, src pointing at their first column, leading dimensions in elements);
// and dst[rows[i], j] += alpha src[i, j] (src (rows_n, width) contiguous, rows distinct).
// dst and src each F32 or BF16.
void AddColumns(int device, DType dst_dt, void* dst, int64_t dst_ld, DType src_dt, const void* src,
                int64_t src_ld, int64_t width, int64_t T, float alpha, bool accumulate);
void AddColumnsAtRows(int device, DType dst_dt, void* dst, int64_t dst_ld, const int32_t* rows,
                      DType src_dt, const void* src, int64_t width, int64_t rows_n, float alpha);
// T rows of row_bytes from src (pitch src_pitch bytes) to dst (pitch dst_pitch bytes).
void CopyColumns(int device, void* dst, int64_t dst_pitch, const void* src, int64_t src_pitch,
                 int64_t row_bytes, int64_t T);
void RopeTables(int device, float* cos, float* sin, const int32_t* positions, const float* inv_freq,
                int64_t T, int64_t half);
void RopeApply(int device, DType dt, void* x, int64_t T, int64_t num_heads, int64_t D,
               int64_t row_stride, const float* cos, const float* sin, bool inverse);
void SwiGluForward(int device, DType dt, void* act, const void* gate_up, int64_t T, int64_t I);
void SwiGluBackward(int device, DType dt, void* dgate_up, const void* dact, const void* gate_up,
                    int64_t T, int64_t I);
// dbias (F32, N) += column sums of x (dt, M x N), rows in order (deterministic).
void ColumnSums(int device, DType dt, float* dbias, const void* x, int64_t M, int64_t N);
void EmbeddingForward(int device, DType dt, void* out, const void* table, const int32_t* tokens,
                      int64_t T, int64_t C);
// dtable (F32 or BF16, V x C) += (atomics: not bit-deterministic in the order of additions).
void EmbeddingBackward(int device, DType dt, DType dtable_dt, void* dtable, const void* dout,
                       const int32_t* tokens, int64_t T, int64_t C);

// --- Attention over packed sequences (qkv rows: H query heads, KV key heads, KV value heads)
void AttentionForward(int device, DType dt, void* out, float* lse, const void* qkv,
                      const int32_t* cu_seqlens, int64_t num_seqs, int64_t T, int64_t H, int64_t KV,
                      int64_t D);
// dqkv (dt) fully written. `scratch` holds T * H floats (delta = rowsum(dout * out)).
void AttentionBackward(int device, DType dt, void* dqkv, const void* dout, const void* qkv,
                       const void* out, const float* lse, const int32_t* cu_seqlens,
                       int64_t num_seqs, int64_t T, int64_t H, int64_t KV, int64_t D,
                       float* scratch);

// Batch-invariant attention over packed sequences: each row in the fixed order of the paged
// kernel (kernels/cuda/paged_attention.cu), so it equals the engine's paged attention bit for
// bit. out (T, H D) =, lse (T, H) =.
void AttentionForwardInvariant(int device, DType dt, void* out, float* lse, const void* qkv,
                               const int32_t* cu_seqlens, int64_t num_seqs, int64_t T, int64_t H,
                               int64_t KV, int64_t D);

// --- Paged KV cache (kernels/paged_attention.h): caches (num_blocks, KV, block_size, D) in dt
void KvCacheWrite(int device, DType dt, void* k_cache, void* v_cache, const void* qkv,
                  const int32_t* slots, int64_t T, int64_t H, int64_t KV, int64_t D,
                  int64_t block_size);
// RopeApply of q and k (cos, sin (T, D/2) F32) then KvCacheWrite, one kernel.
void RopeKvCacheWrite(int device, DType dt, void* k_cache, void* v_cache, void* qkv,
                      const int32_t* slots, const float* cos, const float* sin, int64_t T,
                      int64_t H, int64_t KV, int64_t D, int64_t block_size);
// Copies whole blocks of block_bytes (a multiple of 16) in both caches: pairs (P, 2) I32.
void KvCacheCopyBlocks(int device, void* k_cache, void* v_cache, const int32_t* pairs,
                       int64_t num_pairs, int64_t block_bytes);
// Tables, q_start and context_lens on the device; max_blocks = block_tables' width. invariant:
// the fixed row order of AttentionForwardInvariant (one split); otherwise a row's keys may be
// split over CTAs at small batch (flash decoding) and merged. single_token_rows: q_start[b] =
// b, so tile b is sequence b and no plan kernel runs.
void PagedAttentionForward(int device, DType dt, void* out, const void* qkv, const void* k_cache,
                           const void* v_cache, const int32_t* block_tables, int64_t max_blocks,
                           const int32_t* q_start, const int32_t* context_lens, int64_t num_seqs,
                           int64_t T, int64_t H, int64_t KV, int64_t D, int64_t block_size,
                           bool invariant, bool single_token_rows = false);

// --- LM head log-prob (logits chunk in an F32 scratch of chunk_rows x V) -------------------
// invariant: the logits come from InvariantGemm (then the same row kernel as the sampler's
// log-prob, row_softmax.cuh), so a row's log-prob is independent of R and equals the engine's.
// entropy (R; null: not computed): each row's softmax entropy, lse - sum_v p_v z_v.
void LogprobForward(int device, DType dt, float* logprob, float* lse, const void* h, const void* W,
                    const int32_t* targets, int64_t R, int64_t V, int64_t C, float temperature,
                    float* scratch, int64_t chunk_rows, bool invariant = false,
                    float* entropy = nullptr);
// dh (dt) =, dW (dW_dtype: F32 or dt) += . `dlogits_scratch` holds chunk_rows x V elements of
// dt (BF16 mode converts dlogits for the tensor-core GEMMs; F32 mode may alias `scratch`).
// logits_kept: scratch holds LogprobForward's logits of all R rows (no GEMM recomputes them).
void LogprobBackward(int device, DType dt, void* dh, void* dW, DType dW_dtype,
                     const float* dlogprob, const void* h, const void* W, const int32_t* targets,
                     const float* lse, int64_t R, int64_t V, int64_t C, float temperature,
                     float* scratch, void* dlogits_scratch, int64_t chunk_rows,
                     bool logits_kept = false);

// --- Sampling (kernels/sampling.h): one block of kRowThreads per row; rows on the device --
// split_vocabulary: rows without top-k/top-p are drawn from per-split statistics of many
// blocks per row (sampling_split.cu); greedy and filtered rows keep the one-block kernel.
void SampleTokens(int device, int32_t* tokens, float* logprobs, const float* logits,
                  const SamplingRow* rows, int64_t R, int64_t V, bool split_vocabulary = false);

// --- Optimizer and bookkeeping on flat F32 shards ------------------------------------------
void AdamWUpdate(int device, float* p, const float* g, float* m, float* v, int64_t n, bool decay,
                 float lr, float beta1, float beta2, float eps, float weight_decay, int64_t step,
                 float grad_scale, uint16_t* p_bf16);
void SgdUpdate(int device, float* p, const float* g, int64_t n, float weight_decay, float lr,
               float grad_scale);
void AddInPlace(int device, DType dt, void* dst, const void* src, int64_t n);
// Deterministic (fixed-shape tree) sum of squares in float64; synchronises the stream.
double SumOfSquares(int device, DType dt, const void* x, int64_t n);
// Stream-ordered scratch memory from the device's memory pool (cached: no cudaMalloc in steady
// state); freed in stream order.
void* ScratchAlloc(int device, size_t bytes);
void ScratchFree(int device, void* p);
// dst (to) = src (from), n elements, round to nearest even.
void Convert(int device, DType to, void* dst, DType from, const void* src, int64_t n);
// Fills n elements of dtype dt with `value` (tests poison outputs with NaN).
void Fill(int device, DType dt, void* x, int64_t n, float value);

}  // namespace prl::kernels::cuda
