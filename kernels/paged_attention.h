// The engine's paged KV cache operations (vLLM's PagedAttention on the CPU backend).
//
// A layer's cache is two tensors: k_cache (num_blocks, KV, D, block_size) — keys transposed
// within a block, so a decode row scores eight keys per vector op — and v_cache (num_blocks, KV,
// block_size, D). A block holds block_size consecutive positions of one sequence; position p
// lives in slot block_table[p / block_size] * block_size + p % block_size.
#pragma once

#include "core/tensor.h"
#include "kernels/attention.h"
#include "kernels/reduction_order.h"

namespace prl::kernels {

// Writes the k and v heads of every row of qkv (T, (H + 2 KV) D) to slots (T, I32); a
// negative slot skips the row.
void KvCacheWrite(const Tensor& k_cache, const Tensor& v_cache, const Tensor& qkv,
                  const Tensor& slots, const AttentionShape& shape);

// Copies whole blocks: pairs (P, 2) I32 of (source, destination) block ids.
void KvCacheCopyBlocks(const Tensor& k_cache, const Tensor& v_cache, const Tensor& pairs);

// Causal attention of the step's query rows against each sequence's cached context (their own
// k/v must already be written). Sequence b owns rows [q_start[b], q_start[b+1]) of qkv, which
// are the last positions of its context_lens[b] tokens; block_tables (B, max_blocks) I32.
// out (T, H D) =. In kBatchInvariant order a row's output equals, bit for bit, that of
// AttentionForward(kBatchInvariant) on the full sequence.
void PagedAttentionForward(const Tensor& out, const Tensor& qkv, const Tensor& k_cache,
                           const Tensor& v_cache, const Tensor& block_tables, const Tensor& q_start,
                           const Tensor& context_lens, const AttentionShape& shape,
                           ReductionOrder order);

}  // namespace prl::kernels
