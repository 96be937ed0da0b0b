// Decode attention over the paged KV cache for steps in which every sequence has one query row
// (row b of qkv is sequence b's): the fast order's kernel behind PagedAttentionForward's
// single_token_rows (kernels/cuda/decode_attention.cu). A key row is read once for all the
// query heads of its kv head (BF16: on tensor cores), and the context is split over CTAs (flash
// decoding) when the batch alone cannot fill the GPU. Caches (num_blocks, KV, block_size, D).
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace prl::kernels::cuda {

// D of 64 or 128; BF16 with at most 16 query heads per kv head (tensor cores), F32 with at
// most 8.
bool DecodeAttentionSupported(DType dt, int64_t H, int64_t KV, int64_t D);

// out (B, H D) =; asynchronous on the current stream, capturable in a CUDA graph.
void DecodeAttention(int device, DType dt, void* out, const void* qkv, const void* k_cache,
                     const void* v_cache, const int32_t* block_tables, int64_t max_blocks,
                     const int32_t* context_lens, int64_t num_seqs, int64_t H, int64_t KV,
                     int64_t D, int64_t block_size);

}  // namespace prl::kernels::cuda
