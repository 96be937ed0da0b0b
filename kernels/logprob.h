// The language-model head fused with log-softmax and the gather of target tokens.
//
// logprob[r] = log softmax(h[r] . W^T / temperature)[targets[r]]. The temperature is the
// sampling transform of docs/architecture.md, so the learner's log pi matches the actor's log mu.
// Logits are materialised at most chunk_rows rows at a time (the (R, V) matrix of a long batch
// with a 152k vocabulary would be tens of GB); the backward recomputes them, unless one chunk
// held every row and the forward's logits are still in the scratch (logits_kept: one GEMM of
// the size of the LM head's forward saved).
#pragma once

#include "core/tensor.h"
#include "kernels/reduction_order.h"

namespace prl::kernels {

// Rows of logits per chunk such that one chunk takes about `budget_bytes` (at least 1 row).
int64_t LogprobChunkRows(int64_t vocab_size, int64_t budget_bytes);

// logprob (R) =, lse (R) = log-sum-exp of the scaled logits (kept for the backward).
// h (R, C), W (V, C), targets (R, I32, each in [0, V)), scratch (chunk_rows, V).
// entropy (R, F32; optional) = the entropy of each row's distribution softmax(z) in nats,
// -sum_v p_v log p_v = lse - sum_v p_v z_v (the policy's entropy where the row is trained).
void LogprobForward(const Tensor& logprob, const Tensor& lse, const Tensor& h, const Tensor& W,
                    const Tensor& targets, float temperature, const Tensor& scratch,
                    ReductionOrder order = ReductionOrder::kFast,
                    const Tensor* entropy = nullptr);

// dh (R, C) =, dW (V, C) += the gradients given dlogprob (R). dW undefined: a frozen LM head,
// skipped. logits_kept: scratch (at least R rows) holds the logits LogprobForward left there
// for these h, W, temperature and order, which the backward reads (and overwrites) instead of
// computing them again; the result equals the recomputing backward's (bit for bit on the CPU,
// where the two GEMMs are the same; on CUDA the forward's logits of the batch-invariant order
// replace the fast order's the backward would compute).
void LogprobBackward(const Tensor& dh, const Tensor& dW, const Tensor& dlogprob, const Tensor& h,
                     const Tensor& W, const Tensor& targets, const Tensor& lse, float temperature,
                     const Tensor& scratch, ReductionOrder order = ReductionOrder::kFast,
                     bool logits_kept = false);

}  // namespace prl::kernels
