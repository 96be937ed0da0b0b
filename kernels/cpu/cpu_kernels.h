// The CPU backend of the kernel library: fp32, row-major, raw pointers (llm.c style).
//
// Callers are the dispatchers in kernels/*.cc, which have already checked shapes, dtypes and
// devices; these functions only assert what they rely on beyond that. Every function is
// deterministic for a given thread count and uses OpenMP across rows or heads; GEMMs go to
// OpenBLAS (its OpenMP build runs single-threaded inside our parallel regions).
//
// Conventions: T tokens, C hidden size, V vocabulary, H query heads, KV key/value heads, D
// head size. "+=" in a comment means the output is accumulated into, "=" that it is
// overwritten.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/context_attention.h"
#include "kernels/optimizer.h"
#include "kernels/sampling.h"

namespace prl::kernels::cpu {

// out (M, N) = a (M, K) . w (N, K)^T + bias (N, optional). With accumulate, out += instead
// (the bias is then still added once).
void MatmulForward(float* out, const float* a, const float* w, const float* bias, int64_t M,
                   int64_t N, int64_t K, bool accumulate);
// MatmulForward with a batch-invariant reduction order (matmul_invariant.cc): each output
// element depends only on its row of a and row of w, never on M or on the other rows.
void MatmulForwardInvariant(float* out, const float* a, const float* w, const float* bias,
                            int64_t M, int64_t N, int64_t K, bool accumulate);
// da (M, K) = dout . w (skipped when da is null); dw (N, K) += dout^T . a; dbias (N) +=
// column sums of dout (skipped when null).
void MatmulBackward(float* da, float* dw, float* dbias, const float* dout, const float* a,
                    const float* w, int64_t M, int64_t N, int64_t K);

// y (T, C) = x / sqrt(mean(x^2) + eps) * w; rstd (T) = 1 / sqrt(mean(x^2) + eps).
void RmsNormForward(float* y, float* rstd, const float* x, const float* w, int64_t T, int64_t C,
                    float eps);
// dx (T, C) += dL/dx; dw (C) += dL/dw.
void RmsNormBackward(float* dx, float* dw, const float* dy, const float* x, const float* w,
                     const float* rstd, int64_t T, int64_t C);

// cos, sin (T, D/2): angle = float(position[t]) * inv_freq[i], evaluated in fp32 exactly as
// Hugging Face's LlamaRotaryEmbedding does, then cos/sin of that fp32 angle.
void RopeTables(float* cos, float* sin, const int32_t* positions, const float* inv_freq, int64_t T,
                int64_t half_dim);
// Rotates `num_heads` heads of size D in each of the T rows of x in place (rotate_half
// convention: pairs (i, i + D/2)). Row r starts at x + r * row_stride. inverse rotates by the
// negative angle, which is the backward of the forward rotation.
void RopeApply(float* x, int64_t T, int64_t num_heads, int64_t D, int64_t row_stride,
               const float* cos, const float* sin, bool inverse);

// Causal self-attention over packed sequences (no attention across cu_seqlens boundaries).
// qkv (T, (H + 2 KV) D): q heads, then k heads, then v heads; query head h reads kv head
// h / (H / KV). out (T, H D) =; lse (T, H) = log-sum-exp of each scaled score row.
void AttentionForward(float* out, float* lse, const float* qkv, const int32_t* cu_seqlens,
                      int64_t num_seqs, int64_t H, int64_t KV, int64_t D);
// AttentionForward with a fixed reduction order per query row (invariant_dot.h), the same as
// PagedAttentionForward's invariant mode: the learner and the engine agree bit for bit.
void AttentionForwardInvariant(float* out, float* lse, const float* qkv, const int32_t* cu_seqlens,
                               int64_t num_seqs, int64_t H, int64_t KV, int64_t D);
// dqkv (T, (H + 2 KV) D) = gradient w.r.t. qkv, given dout (T, H D) and the forward's out,
// lse. Recomputes the scores (nothing of size T^2 is stored between the passes).
void AttentionBackward(float* dqkv, const float* dout, const float* qkv, const float* out,
                       const float* lse, const int32_t* cu_seqlens, int64_t num_seqs, int64_t H,
                       int64_t KV, int64_t D);
// Where attention's keys and values are: row r's key head g at rows + r stride + k_col + g D,
// its value head g at v_col instead of k_col.
struct KvRows {
  const float* rows;
  int64_t stride, k_col, v_col;
};
// Where their gradients go: the same layout, written (or added to, with accumulate).
struct KvGrads {
  float* rows;
  int64_t stride, k_col, v_col;
  bool accumulate;
};
// Attention of runs of query positions (kernels/context_attention.h's QueryPiece: the pieces'
// queries in qkv's rows, their sequences' keys and values in kv). Backward writes the query
// columns of dqkv and the keys' and values' gradients (kv_rows of them) into dkv. The packed
// AttentionForward / AttentionBackward above are these with each sequence one piece.
void ContextAttentionForward(float* out, float* lse, const float* qkv, const KvRows& kv,
                             const QueryPiece* pieces, int64_t num_pieces, int64_t H, int64_t KV,
                             int64_t D);
void ContextAttentionBackward(float* dqkv, const KvGrads& dkv, const float* dout,
                              const float* qkv, const KvRows& kv, const float* out,
                              const float* lse, const QueryPiece* pieces, int64_t num_pieces,
                              int64_t H, int64_t KV, int64_t D, int64_t kv_rows);

// Paged KV cache (engine). A block holds block_size consecutive positions of one sequence:
// keys (num_blocks, KV, D, block_size) transposed within the block, values (num_blocks, KV,
// block_size, D). slot = block * block_size + offset.
//
// Writes the k and v heads of each row of qkv (T, (H + 2 KV) D) into its slot (slots[t] < 0:
// skipped).
void KvCacheWrite(float* k_cache, float* v_cache, const float* qkv, const int32_t* slots, int64_t T,
                  int64_t H, int64_t KV, int64_t D, int64_t block_size);
// Copies whole blocks pairs[2i] -> pairs[2i + 1] (copy-on-write of shared blocks).
void KvCacheCopyBlocks(float* k_cache, float* v_cache, const int32_t* pairs, int64_t num_pairs,
                       int64_t KV, int64_t D, int64_t block_size);
// Causal attention of new query rows against the paged cache, which already holds their own
// k/v. Sequence b owns query rows [q_start[b], q_start[b+1]) at the last positions of its
// context of context_lens[b] tokens, and its blocks are block_tables[b * max_blocks ...].
// out (T, H D) =.
void PagedAttentionForward(float* out, const float* qkv, const float* k_cache, const float* v_cache,
                           const int32_t* block_tables, int64_t max_blocks, const int32_t* q_start,
                           const int32_t* context_lens, int64_t num_seqs, int64_t H, int64_t KV,
                           int64_t D, int64_t block_size, bool invariant);

// Draws tokens (R) and behaviour log-probs (R) from logits (R, V) (kernels/sampling.h).
void SampleTokens(int32_t* tokens, float* logprobs, const float* logits, const SamplingRow* rows,
                  int64_t R, int64_t V);
// The top-k / top-p kept set of one row (top_k 0 or >= V: no top-k; top_p 1: no top-p):
// ids = the kept token ids in canonical order (z descending, ties by lower id), the order the
// sampler draws in when a filter is on; returns their mass of e. e (V) = exp(z - max z) and
// total = its sum. (tests/kernels/sampling_cut_test.cc pins the CUDA sampler's kept set to it.)
double KeepTopKTopP(std::vector<int32_t>& ids, const float* z, const float* e, int64_t V,
                    double total, int32_t top_k, float top_p);
// The k most likely tokens of the distribution a row of logits (V) draws from, with their
// log-probs (kernels/sampling.h: TopLogprobs).
std::vector<std::pair<int32_t, float>> TopLogprobs(const float* logits, int64_t V,
                                                   const SamplingRow& row, int32_t k);

// gate_up (T, 2 I): gate in columns [0, I), up in [I, 2 I). act (T, I) = silu(gate) * up.
void SwiGluForward(float* act, const float* gate_up, int64_t T, int64_t I);
// dgate_up (T, 2 I) = gradient given dact (T, I).
void SwiGluBackward(float* dgate_up, const float* dact, const float* gate_up, int64_t T, int64_t I);

// out (T, C) = table[tokens[t]].
void EmbeddingForward(float* out, const float* table, const int32_t* tokens, int64_t T, int64_t C);
// dtable (V, C) += scatter of dout (T, C) by tokens.
void EmbeddingBackward(float* dtable, const float* dout, const int32_t* tokens, int64_t T,
                       int64_t C);

// Language-model head fused with log-softmax and target gather, in row chunks so that at most
// (chunk_rows, V) logits exist at a time. For row r: z = h[r] . W^T / temperature,
// lse[r] = logsumexp(z), logprob[r] = z[targets[r]] - lse[r]. h (R, C), W (V, C).
// scratch holds chunk_rows * V floats. invariant: the logits GEMM is MatmulForwardInvariant.
// entropy (R; null: not computed) = lse[r] - sum_v softmax(z)_v z_v (vec_math.h SoftmaxMean).
void LogprobForward(float* logprob, float* lse, const float* h, const float* W,
                    const int32_t* targets, int64_t R, int64_t V, int64_t C, float temperature,
                    float* scratch, int64_t chunk_rows, bool invariant, float* entropy = nullptr);
// dh (R, C) =, dW (V, C) += gradients given dlogprob (R); recomputes the logits per chunk,
// unless logits_kept (scratch holds LogprobForward's scaled logits of all R rows).
void LogprobBackward(float* dh, float* dW, const float* dlogprob, const float* h, const float* W,
                     const int32_t* targets, const float* lse, int64_t R, int64_t V, int64_t C,
                     float temperature, float* scratch, int64_t chunk_rows, bool invariant,
                     bool logits_kept = false);

// Optimizer (kernels/optimizer.h), on n contiguous elements.
void AdamWUpdate(float* p, const float* g, float* m, float* v, int64_t n, bool decay,
                 const AdamWStep& step);
void SgdUpdate(float* p, const float* g, int64_t n, float weight_decay, float lr, float grad_scale);
void AddInPlace(float* dst, const float* src, int64_t n);
double SumOfSquares(const float* x, int64_t n);

}  // namespace prl::kernels::cpu
