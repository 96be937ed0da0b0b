// Context parallelism (learner.context_parallel): the tokens of each sequence of a micro-batch
// are split over the C ranks of a group, so that no rank holds a whole long sequence's
// activations. Each rank runs the model on its share; everything but attention is per token.
// Attention gathers every sequence's keys and values from the group (all-gather, as Llama 3's
// context parallelism: with grouped-query attention the k|v rows are a small part of a token's
// activations) and attends its own queries to them (kernels/context_attention.h); the backward
// gathers them again and sums the key/value gradients over the group (reduce-scatter).
//
// The split balances causal attention's cost: a sequence of n tokens is cut into 2C chunks of
// n / (2C) (rounded down at each boundary), and rank r holds chunks r and 2C - 1 - r, one from
// the front and one from the back. A sequence shorter than 2C leaves some ranks none of it.
//
// The results are those of C = 1 to within fp32 rounding: log-probs, entropies and routes per
// token; gradients summed over the group (FSDP's reduce-scatter over all ranks does that); the
// Qwen3-MoE load-balancing loss over the group's tokens (its counts reduced over the group).
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/enum_names.h"
#include "core/tensor.h"
#include "kernels/context_attention.h"
#include "model/packed_batch.h"

namespace prl {

// The group's collectives (the learner's: a Gloo communicator of the group's ranks).
class ContextExchange {
 public:
  virtual ~ContextExchange() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // shard (n) on every rank -> out (size n), rank r's shard at [r n, (r + 1) n).
  virtual absl::Status AllGather(const Tensor& shard, const Tensor& out) = 0;
  // in (size n) on every rank, summed over the group: shard (n) = the sum's [rank n, (rank+1) n).
  virtual absl::Status ReduceScatter(const Tensor& in, const Tensor& shard) = 0;
  // in (size n): block r of n / size to rank r; out (size n): block r from rank r.
  virtual absl::Status AllToAll(const Tensor& in, const Tensor& out) = 0;
  // send to rank (rank + 1) % size while recv (as large) comes from rank (rank - 1) % size.
  virtual absl::Status Shift(const Tensor& send, const Tensor& recv) = 0;
  // values (host) summed over the group.
  virtual absl::Status AllReduceHost(absl::Span<double> values) = 0;
};

// Positions [begin, end) of one sequence.
struct PositionRun {
  int64_t begin = 0, end = 0;
};
// The runs of a sequence of `length` tokens that rank `rank` of `size` holds: chunks rank and
// 2 size - 1 - rank of 2 size (empty chunks dropped).
std::vector<PositionRun> ContextRuns(int64_t length, int rank, int size);

// Rank `rank`'s share of `full` (whole sequences): each sequence's runs, concatenated, as one
// sequence of the share (a sequence of which the rank holds nothing is left out), with their
// targets and routes. A rank that holds nothing of any sequence gets one untrained token (its
// collectives must still run), which ContextPlan accounts for.
PackedBatch ShardBatch(const PackedBatch& full, int rank, int size);

// The rows of `full` (token indices) rank `rank` of `size` holds, in its share's order (without
// the untrained token of a share of nothing).
std::vector<int64_t> ShareRows(const PackedBatch& full, int rank, int size);

// How attention crosses the split (learner.context_parallel_attention):
//   kAllGather: every layer all-gathers the group's keys and values and attends the rank's own
//     queries to them (kernels/context_attention.h); any head count.
//   kUlysses: DeepSpeed-Ulysses: an all-to-all trades the rank's tokens of every head for every
//     token of 1/C of the heads, the packed attention runs on whole sequences, and a second
//     all-to-all trades back (model/context_heads.h); the heads must split over the group.
//   kRing: ring attention: the k|v blocks travel around the group in C steps, each attended
//     and merged by its log-sum-exp (model/context_ring.h); a rank holds two blocks at most.
enum class ContextAttention { kAllGather, kUlysses, kRing };
inline constexpr NamedValue<ContextAttention> kContextAttentionNames[] = {
    {"allgather", ContextAttention::kAllGather},
    {"ulysses", ContextAttention::kUlysses},
    {"ring", ContextAttention::kRing}};

// A pass over a share (Transformer::Forward's `context`): the group, the lengths of the full
// batch's sequences, in order, and how attention crosses the split.
struct ContextShard {
  ContextExchange* exchange = nullptr;
  std::vector<int64_t> lengths;
  ContextAttention attention = ContextAttention::kAllGather;
};

// What a rank's pass derives from its shard.
struct ContextPlan {
  int rank = 0, size = 1;
  int64_t kv_rows = 0;   // the full batch's tokens: rows of the gathered k|v
  int64_t max_rows = 0;  // the most tokens any rank holds: the exchanges' rows per rank
  // For every rank, where its local rows go in the gathered rows: (first gathered row, rows),
  // in the order the rank's rows are laid out.
  std::vector<std::vector<std::pair<int64_t, int64_t>>> rank_rows;
  std::vector<kernels::QueryPiece> pieces;  // this rank's queries
  std::vector<int32_t> positions;           // (T) each local token's position in its sequence
  // The gathered rows' sequences (the full batch's, then one row per rank that holds nothing):
  // boundaries, kv_rows at the end (a packed batch's cu_seqlens; Ulysses attends over them).
  std::vector<int32_t> kv_cu_seqlens;

  // The share `local` must be ShardBatch(full, exchange->rank(), exchange->size()) of a batch
  // whose sequences have shard.lengths; errors name what does not fit.
  static absl::StatusOr<ContextPlan> Make(const ContextShard& shard, const PackedBatch& local,
                                          int64_t max_position_embeddings);
};

// Every rank's local k|v rows (the columns after the q_width query columns of qkv, (T, W))
// gathered into kv (plan.kv_rows, W - q_width) in the sequences' order, through the exchange's
// buffers send (plan.max_rows, W - q_width) and recv (plan.size plan.max_rows, W - q_width). CPU.
absl::Status GatherKeysValues(const ContextPlan& plan, ContextExchange& exchange,
                              const Tensor& qkv, int64_t q_width, const Tensor& send,
                              const Tensor& recv, const Tensor& kv);
// The gradient at the gathered k|v rows, dkv (plan.kv_rows, W - q_width), summed over the group;
// this rank's rows' share written into the k|v columns of dqkv (T, W). Buffers: send
// (plan.size plan.max_rows, W - q_width), recv (plan.max_rows, W - q_width). CPU.
absl::Status ScatterKeyValueGrads(const ContextPlan& plan, ContextExchange& exchange,
                                  const Tensor& dkv, const Tensor& send, const Tensor& recv,
                                  const Tensor& dqkv, int64_t q_width);

}  // namespace prl
