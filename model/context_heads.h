// Ulysses' context parallelism (learner.context_parallel_attention = ulysses; DeepSpeed-Ulysses,
// as verl and AReaL run it): before attention an all-to-all trades a rank's share of the tokens
// of every head for every token of 1/C of the heads, the packed attention (kernels/attention.h)
// runs on the group's whole sequences for those heads, and a second all-to-all trades the
// output back. The backward trades the layer's q|k|v, output, log-sum-exp and output gradient
// the same way, runs the packed backward, and trades the q|k|v gradient back.
//
// Rank r attends query heads [r H / C, (r + 1) H / C) and the key/value heads they read: with
// more ranks than key/value heads (C > KV) several ranks read the same one, and the gradients
// they send back for it are summed. H must be a multiple of C, and each rank's query heads must
// cover whole key/value groups or lie inside one (UlyssesHeads names what does not split).
//
// Per layer each rank sends and receives about (C - 1) / C of its tokens' q|k|v and output
// (forward), against (C - 1) of its tokens' k|v for the all-gather (model/context_parallel.h):
// more bytes with grouped-query attention's few key/value heads, fewer with many.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "core/tensor.h"
#include "model/context_parallel.h"

namespace prl {

// The heads rank `rank` of a group of `size` attends: query heads [q0, q0 + heads), key/value
// heads [kv0, kv0 + kv_heads).
struct HeadSlice {
  int64_t q0 = 0, heads = 0, kv0 = 0, kv_heads = 0;
};

// The error names learner.context_parallel and learner.context_parallel_attention when the
// heads do not split over the group.
absl::StatusOr<HeadSlice> UlyssesHeads(int64_t num_heads, int64_t num_kv_heads, int rank,
                                       int size);

// Columns [begin, begin + width) of a row.
struct ColumnRange {
  int64_t begin = 0, width = 0;
};
// For each rank s of the group, the columns of a local row that s's slice holds, in the slice's
// order.
using SliceColumns = std::vector<std::vector<ColumnRange>>;
// q|k|v rows, (H + 2 KV) D wide: each rank's query heads, then its key heads, then its values'.
SliceColumns QkvColumns(int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, int size);
// Rows of `width` values per query head (attention's output: head_dim; its log-sum-exp: 1).
SliceColumns HeadColumns(int64_t num_heads, int64_t num_kv_heads, int64_t width, int size);
// The widest slice a rank holds of `columns` (the exchanges' row width).
int64_t SliceWidth(const SliceColumns& columns);

// local (T, W) on every rank -> slice (plan.kv_rows, its width) on each: the group's rows in
// the sequences' order (as the all-gather's), this rank's columns. One all-to-all through send
// and recv (at least plan.size plan.max_rows SliceWidth elements of local's dtype each). In
// host memory (f32) or on a CUDA device (any dtype; strided copies on the current stream).
absl::Status ToHeads(const ContextPlan& plan, ContextExchange& exchange, const Tensor& local,
                     const SliceColumns& columns, const Tensor& send, const Tensor& recv,
                     const Tensor& slice);

// The reverse: each rank's slice (plan.kv_rows, its width) -> local (T, W) =, for this rank's
// rows, the sum over the ranks whose slices hold a column (one rank for a query head's; every
// rank reading a key/value head when C > KV; the CPU only: ContextHeadsOnDevice). Columns of no
// slice are left alone.
absl::Status FromHeads(const ContextPlan& plan, ContextExchange& exchange, const Tensor& slice,
                       const SliceColumns& columns, const Tensor& send, const Tensor& recv,
                       const Tensor& local);

// On a CUDA device each column of q|k|v must come from one rank (no key/value head shared):
// the error names learner.context_parallel when num_kv_heads is not a multiple of `size`.
absl::Status ContextHeadsOnDevice(int64_t num_heads, int64_t num_kv_heads, int size);

}  // namespace prl
