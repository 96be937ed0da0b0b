// FlashAttention-2 style causal GQA attention over packed variable-length sequences on the GPU:
// the fused path of kernels/attention.h for BF16 storage and head_dim 64 or 128 (Qwen2.5's
// sizes). Other calls (F32 storage, the exact mode; other head sizes up to 256; unaligned
// pointers) take the generic warp-per-row kernels of cuda_ops.h (kernels/cuda/attention.cu).
//
// Shapes as in kernels/attention.h: qkv (T, (H + 2 KV) D) bf16 rows of H query, KV key and KV
// value heads; cu_seqlens (B + 1) I32 on the device; out (T, H D) bf16; lse (T, H) F32 natural
// log-sum-exp of the scores scaled by 1/sqrt(D); query head h reads kv head h / (H / KV).
//
// What runs: bf16 tensor cores (mma.sync m16n8k16, ldmatrix, cp.async), fp32 accumulation and
// fp32 online softmax; the probabilities and dS are rounded to bf16 as the A operand of the
// second product of each pair, as FlashAttention-2 does. Tiles of 64 queries x 64 keys (4 warps,
// 16 query rows each), causal tile skipping; the query tile -> sequence map is a binary search
// on the device over cu_seqlens (attention_tile.cuh), so no host round trip and no extra kernel.
//
// Backward: delta = rowsum(dout * out), then two kernels that recompute P from the saved lse:
// dQ per query tile (loops over key tiles), dK/dV per key tile and KV head (loops over the
// group's query heads and the later query tiles). Every element is written exactly once by one
// thread, with no atomics: the backward is deterministic (bit-identical run to run).
//
// Reduction order: each row's result depends only on its own sequence (the key-tile order is
// fixed), so kBatchInvariant holds for the rows of a sequence whatever it is packed with. The
// fused and the generic kernels round differently: results differ between them (within bf16
// tolerance), never between runs.
#pragma once

#include <cstdint>
#include <initializer_list>

#include "core/dtype.h"

namespace prl::kernels::cuda {

// Whether the fused kernels take a call: BF16 storage, D in {64, 128}, and every bf16 tensor
// pointer 16-byte aligned (rows are read with 16-byte copies).
bool FlashAttentionSupported(DType dt, int64_t D, std::initializer_list<const void*> tensors);

// out (T, H D) =, lse (T, H) =. Requires FlashAttentionSupported.
void FlashAttentionForward(int device, void* out, float* lse, const void* qkv,
                           const int32_t* cu_seqlens, int64_t num_seqs, int64_t T, int64_t H,
                           int64_t KV, int64_t D);

// dqkv (T, (H + 2 KV) D) = (fully written), given dout (T, H D) and the forward's qkv, out,
// lse. `delta` is scratch for T * H floats. Requires FlashAttentionSupported.
void FlashAttentionBackward(int device, void* dqkv, const void* dout, const void* qkv,
                            const void* out, const float* lse, const int32_t* cu_seqlens,
                            int64_t num_seqs, int64_t T, int64_t H, int64_t KV, int64_t D,
                            float* delta);

}  // namespace prl::kernels::cuda
