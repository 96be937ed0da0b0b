// Ring attention's context parallelism (learner.context_parallel_attention = ring; Liu et al.,
// as Megatron's and torchtitan's context parallelism run it): the group's k|v blocks travel
// around the ring of its C ranks (rank r sends to r + 1), and each rank attends its own queries
// to the block it holds at each of the C steps, merging the steps' partial outputs by their
// log-sum-exps (the online softmax). No rank ever holds more than two blocks of k|v: its own
// share's rows, not the group's.
//
// The backward sends the blocks around again, each with its keys' and values' gradients, which
// every rank adds its queries' share to; after C steps a block's gradients are back at its
// owner. The partial outputs need no merge there: the backward of each block's scores uses the
// final log-sum-exp and output (FlashAttention's), so the query gradients simply add up.
//
// The split's chunks are aligned (model/context_parallel.h: every rank cuts a sequence into the
// same 2C chunks), so a key chunk is either a query chunk itself (causal, the diagonal) or wholly
// before or after it (all keys visible, or none): each step's attention is the packed kernel's
// blocked GEMMs over one of those two shapes (kernels/context_attention.h, QueryPiece::keys).
//
// Per layer each rank sends C - 1 blocks of its k|v rows forward (as many bytes as the
// all-gather's), and 2 C - 1 of k|v and their gradients backward, in C sequential steps: with a
// synchronous exchange (Gloo on the CPU) nothing overlaps them with the attention. CPU, f32.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "core/tensor.h"
#include "kernels/attention.h"
#include "kernels/context_attention.h"
#include "model/context_parallel.h"

namespace prl {

// What rank plan.rank attends at each step: steps[j] holds the kernel calls against the block
// of rank (rank - j) mod size, each call's pieces (kv0 a row of the block) covering a local
// query row at most once, so that a call's output merges into the running one.
struct RingSteps {
  std::vector<std::vector<std::vector<kernels::QueryPiece>>> steps;
  static RingSteps Make(const ContextPlan& plan);
};

// The ring's buffers: blocks of k|v rows (plan.max_rows, 2 KV D) and, for one call, a partial
// output (T, H D) and log-sum-exp (T, H); in Backward the blocks' gradients (as the blocks) and
// a call's query gradients (T, (H + 2 KV) D, its query columns used).
struct RingBuffers {
  Tensor block, next, part_out, part_lse;
  Tensor dblock, dnext, part_dqkv;
};

// out (T, H D) = and lse (T, H) = attention of the local queries of qkv (T, (H + 2 KV) D; RoPE
// applied) over the group's keys and values: every layer's C steps.
absl::Status RingAttentionForward(const ContextPlan& plan, const RingSteps& ring,
                                  ContextExchange& exchange, const Tensor& qkv,
                                  const kernels::AttentionShape& shape, const RingBuffers& buffers,
                                  const Tensor& out, const Tensor& lse);

// dqkv (T, (H + 2 KV) D) = the gradient at the local q|k|v rows, given dout (T, H D) and the
// forward's qkv, out and lse.
absl::Status RingAttentionBackward(const ContextPlan& plan, const RingSteps& ring,
                                   ContextExchange& exchange, const Tensor& dqkv,
                                   const Tensor& dout, const Tensor& qkv, const Tensor& out,
                                   const Tensor& lse, const kernels::AttentionShape& shape,
                                   const RingBuffers& buffers);

}  // namespace prl
