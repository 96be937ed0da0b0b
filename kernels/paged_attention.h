// The engine's paged KV cache operations (vLLM's PagedAttention on the CPU backend).
//
// A layer's cache is two tensors. On the CPU (F32): k_cache (num_blocks, KV, D, block_size) —
// keys transposed within a block, so a decode row scores eight keys per vector op — and v_cache
// (num_blocks, KV, block_size, D). On CUDA both are (num_blocks, KV, block_size, D) in the
// activations' dtype (BF16, or F32 in the exact mode): a key row is D contiguous elements
// (kernels/cuda/paged_attention.cu). A block holds block_size consecutive positions of one
// sequence; position p lives in slot block_table[p / block_size] * block_size + p % block_size.
//
// The engine's metadata tensors (slots, block tables, q_start, context lengths) live on the
// cache's device; on CUDA nothing is read back to the host, so the calls are asynchronous and
// capturable in a CUDA graph.
#pragma once

#include "core/tensor.h"
#include "kernels/attention.h"
#include "kernels/reduction_order.h"

namespace prl::kernels {

// The cache's block size (tokens per block) from k_cache's shape on its device.
int64_t KvCacheBlockSize(const Tensor& k_cache);

// Writes the k and v heads of every row of qkv (T, (H + 2 KV) D) to slots (T, I32); a
// negative slot skips the row.
void KvCacheWrite(const Tensor& k_cache, const Tensor& v_cache, const Tensor& qkv,
                  const Tensor& slots, const AttentionShape& shape);

// RopeApply (q and k heads of qkv, in place) then KvCacheWrite, in one pass on CUDA: each
// rotated k and each v reaches its slot in the same thread that rotated it. The results equal
// the two calls' bit for bit (the rotation is the same device function).
void RopeKvCacheWrite(const Tensor& k_cache, const Tensor& v_cache, const Tensor& qkv,
                      const Tensor& slots, const Tensor& cos, const Tensor& sin,
                      const AttentionShape& shape);

// Copies whole blocks: pairs (P, 2) I32 of (source, destination) block ids. On CUDA the pairs
// of one call are copied in parallel: no destination may be another pair's source.
void KvCacheCopyBlocks(const Tensor& k_cache, const Tensor& v_cache, const Tensor& pairs);

// Causal attention of the step's query rows against each sequence's cached context (their own
// k/v must already be written). Sequence b owns rows [q_start[b], q_start[b+1]) of qkv, which
// are the last positions of its context_lens[b] tokens; block_tables (B, max_blocks) I32.
// out (T, H D) =. In kBatchInvariant order a row's output equals, bit for bit, that of
// AttentionForward(kBatchInvariant) on the full sequence on the same device.
// single_token_rows promises q_start[b] = b (every sequence decodes one token, T = B): CUDA
// then maps sequence b to tile b without the per-call tile-planning kernel.
void PagedAttentionForward(const Tensor& out, const Tensor& qkv, const Tensor& k_cache,
                           const Tensor& v_cache, const Tensor& block_tables, const Tensor& q_start,
                           const Tensor& context_lens, const AttentionShape& shape,
                           ReductionOrder order, bool single_token_rows = false);

}  // namespace prl::kernels
