// Causal attention for context parallelism (model/context_parallel.h): a rank holds some runs of
// consecutive positions of each sequence ("pieces"), and attends its pieces' queries to the keys
// and values of its whole sequences, gathered from every rank of its group.
//
// A piece is rows [row0, row0 + len) of the local q|k|v rows, at positions [pos0, pos0 + len) of
// the sequence whose gathered k|v rows start at kv0 (row kv0 + p holds position p). A query at
// position p attends to positions 0..p of its sequence. Scores are scaled by 1/sqrt(D), as
// AttentionForward's, whose results these are for a rank that holds every position (to within
// fp32 rounding: the same blocked GEMMs, over a different split of the keys).
//
// CPU only (the CUDA path of context parallelism waits for a GPU session; the learner refuses it).
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "kernels/attention.h"

namespace prl::kernels {

struct QueryPiece {
  int64_t row0 = 0;  // first local row
  int64_t len = 0;   // rows (positions)
  int64_t pos0 = 0;  // position of the first row in its sequence
  int64_t kv0 = 0;   // first gathered k|v row of its sequence (position 0)
  // > 0: a block of earlier positions (ring attention's, model/context_ring.h): every query of
  // the piece sees the `keys` k|v rows [kv0, kv0 + keys), pos0 unused. 0: the causal prefix.
  int64_t keys = 0;
};

// qkv (T, (H + 2 KV) D) the local rows (RoPE applied); kv (T_kv, 2 KV D) the gathered keys then
// values of the pieces' sequences. out (T, H D) =; lse (T, H) =. Rows of no piece are left alone.
void ContextAttentionForward(const Tensor& out, const Tensor& lse, const Tensor& qkv,
                             const Tensor& kv, const std::vector<QueryPiece>& pieces,
                             const AttentionShape& shape);

// Given dout (T, H D) and the forward's qkv, kv, out and lse: the query columns of dqkv
// (T, (H + 2 KV) D) = the gradient at the local queries (its k|v columns are left alone), and
// dkv (T_kv, 2 KV D) += the gradient at the gathered keys and values from this rank's queries
// (the caller sums it over the group and keeps its own rows' share).
void ContextAttentionBackward(const Tensor& dqkv, const Tensor& dkv, const Tensor& dout,
                              const Tensor& qkv, const Tensor& kv, const Tensor& out,
                              const Tensor& lse, const std::vector<QueryPiece>& pieces,
                              const AttentionShape& shape);

}  // namespace prl::kernels
