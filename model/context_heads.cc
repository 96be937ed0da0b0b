#include "model/context_heads.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/cuda_runtime.h"
#include "core/status_macros.h"

namespace prl {

absl::StatusOr<HeadSlice> UlyssesHeads(int64_t num_heads, int64_t num_kv_heads, int rank,
                                       int size) {
  const int64_t H = num_heads, KV = num_kv_heads, C = size;
  if (C < 1 || rank < 0 || rank >= C || KV < 1 || H % KV != 0) {
    return absl::InvalidArgumentError(absl::StrCat("ulysses: rank ", rank, " of ", size,
                                                   " with ", H, " / ", KV, " heads"));
  }
  const int64_t group = H / KV;  // query heads per key/value head
  const int64_t heads = H / C;
  if (H % C != 0 || (heads % group != 0 && group % heads != 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "learner.context_parallel_attention = ulysses splits the attention heads over the "
        "group: expected learner.context_parallel dividing the ",
        H, " query heads into whole key/value groups of ", group,
        " (or parts of one), found learner.context_parallel = ", C,
        "; use learner.context_parallel_attention = allgather (any head count) or a group size "
        "that divides the heads"));
  }
  HeadSlice s;
  s.q0 = rank * heads;
  s.heads = heads;
  s.kv0 = s.q0 / group;
  s.kv_heads = std::max<int64_t>(1, heads / group);
  return s;
}

SliceColumns QkvColumns(int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, int size) {
  SliceColumns columns(size);
  for (int r = 0; r < size; ++r) {
    const HeadSlice s = *UlyssesHeads(num_heads, num_kv_heads, r, size);
    columns[r] = {{s.q0 * head_dim, s.heads * head_dim},
                  {(num_heads + s.kv0) * head_dim, s.kv_heads * head_dim},
                  {(num_heads + num_kv_heads + s.kv0) * head_dim, s.kv_heads * head_dim}};
  }
  return columns;
}

SliceColumns HeadColumns(int64_t num_heads, int64_t num_kv_heads, int64_t width, int size) {
  SliceColumns columns(size);
  for (int r = 0; r < size; ++r) {
    const HeadSlice s = *UlyssesHeads(num_heads, num_kv_heads, r, size);
    columns[r] = {{s.q0 * width, s.heads * width}};
  }
  return columns;
}

int64_t SliceWidth(const SliceColumns& columns) {
  int64_t widest = 0;
  for (const std::vector<ColumnRange>& ranges : columns) {
    int64_t width = 0;
    for (const ColumnRange& c : ranges) width += c.width;
    widest = std::max(widest, width);
  }
  return widest;
}

namespace {

absl::Status CheckShapes(const ContextPlan& plan, const Tensor& local, const SliceColumns& columns,
                         const Tensor& send, const Tensor& recv, const Tensor& slice) {
  const size_t bytes = plan.size * plan.max_rows * SliceWidth(columns) * DTypeSize(local.dtype);
  if (static_cast<int>(columns.size()) != plan.size || send.bytes() < bytes ||
      recv.bytes() < bytes || local.rank != 2 || slice.rank != 2 ||
      slice.size(0) != plan.kv_rows || slice.size(1) != SliceWidth(columns) ||
      slice.dtype != local.dtype || send.device != local.device || recv.device != local.device ||
      slice.device != local.device) {
    return absl::InternalError(absl::StrCat(
        "ulysses: local ", local.ShapeString(), ", slice ", slice.ShapeString(), ", send ",
        send.ShapeString(), ", recv ", recv.ShapeString(), " do not fit a group of ", plan.size,
        " with ", plan.kv_rows, " rows, at most ", plan.max_rows, " per rank"));
  }
  return absl::OkStatus();
}

// n elements of `like`'s dtype at the start of a buffer laid out for the widest exchange.
Tensor Prefix(const Tensor& buffer, const Tensor& like, int64_t n) {
  return Tensor(buffer.data, like.dtype, buffer.device, {n});
}

// rows rows of `width` elements from src (a row every src_pitch elements) to dst (every
// dst_pitch), in host memory or on the device (the current stream, waited for).
absl::Status CopyRows(const Device& device, size_t elem, void* dst, int64_t dst_pitch,
                      const void* src, int64_t src_pitch, int64_t rows, int64_t width) {
  if (device.is_cpu()) {
    for (int64_t r = 0; r < rows; ++r) {
      std::memcpy(static_cast<char*>(dst) + r * dst_pitch * elem,
                  static_cast<const char*>(src) + r * src_pitch * elem, width * elem);
    }
    return absl::OkStatus();
  }
  return cuda::Memcpy2DOnCurrentStream(device.index, dst, dst_pitch * elem, src, src_pitch * elem,
                                       width * elem, rows);
}

// n contiguous elements.
absl::Status CopyElements(const Device& device, size_t elem, void* dst, const void* src,
                          int64_t n) {
  return CopyRows(device, elem, dst, n, src, n, /*rows=*/1, n);
}

char* At(const Tensor& t, int64_t element) {
  return static_cast<char*>(t.data) + element * static_cast<int64_t>(DTypeSize(t.dtype));
}

}  // namespace

absl::Status ToHeads(const ContextPlan& plan, ContextExchange& exchange, const Tensor& local,
                     const SliceColumns& columns, const Tensor& send, const Tensor& recv,
                     const Tensor& slice) {
  PRL_RETURN_IF_ERROR(CheckShapes(plan, local, columns, send, recv, slice));
  const int64_t W = local.size(1), T = local.size(0), w = SliceWidth(columns);
  const int64_t block = plan.max_rows * w;
  const size_t elem = DTypeSize(local.dtype);
  const Device device = local.device;
  // Block s: this rank's rows, the columns of s's slice.
  for (int s = 0; s < plan.size; ++s) {
    int64_t at = s * block;
    for (const ColumnRange& c : columns[s]) {
      PRL_RETURN_IF_ERROR(
          CopyRows(device, elem, At(send, at), w, At(local, c.begin), W, T, c.width));
      at += c.width;
    }
  }
  PRL_RETURN_IF_ERROR(exchange.AllToAll(Prefix(send, local, plan.size * block),
                                        Prefix(recv, local, plan.size * block)));
  // Block r: rank r's rows of this rank's slice, laid at their places in the sequences.
  for (int r = 0; r < plan.size; ++r) {
    int64_t from = r * block;
    for (const auto& [row, rows] : plan.rank_rows[r]) {
      PRL_RETURN_IF_ERROR(CopyElements(device, elem, At(slice, row * w), At(recv, from), rows * w));
      from += rows * w;
    }
  }
  return absl::OkStatus();
}

absl::Status FromHeads(const ContextPlan& plan, ContextExchange& exchange, const Tensor& slice,
                       const SliceColumns& columns, const Tensor& send, const Tensor& recv,
                       const Tensor& local) {
  PRL_RETURN_IF_ERROR(CheckShapes(plan, local, columns, send, recv, slice));
  const int64_t W = local.size(1), T = local.size(0), w = SliceWidth(columns);
  const int64_t block = plan.max_rows * w;
  const size_t elem = DTypeSize(local.dtype);
  const Device device = local.device;
  // Block r: rank r's rows of this rank's slice.
  for (int r = 0; r < plan.size; ++r) {
    int64_t to = r * block;
    for (const auto& [row, rows] : plan.rank_rows[r]) {
      PRL_RETURN_IF_ERROR(CopyElements(device, elem, At(send, to), At(slice, row * w), rows * w));
      to += rows * w;
    }
  }
  PRL_RETURN_IF_ERROR(exchange.AllToAll(Prefix(send, local, plan.size * block),
                                        Prefix(recv, local, plan.size * block)));
  if (!device.is_cpu()) {
    // On the device each column comes from one rank (ContextHeadsOnDevice refuses shared
    // key/value heads): block s's columns copied into place.
    for (int s = 0; s < plan.size; ++s) {
      int64_t at = s * block;
      for (const ColumnRange& c : columns[s]) {
        PRL_RETURN_IF_ERROR(
            CopyRows(device, elem, At(local, c.begin), W, At(recv, at), w, T, c.width));
        at += c.width;
      }
    }
    return absl::OkStatus();
  }
  // Block s: this rank's rows of s's slice, summed into s's columns in rank order (the same
  // order on every run: deterministic).
  for (int64_t t = 0; t < T; ++t) {
    float* row = local.f32() + t * W;
    for (int s = 0; s < plan.size; ++s) {
      for (const ColumnRange& c : columns[s]) std::fill_n(row + c.begin, c.width, 0.0f);
    }
  }
  for (int s = 0; s < plan.size; ++s) {
    const float* from = recv.f32() + s * block;
    for (int64_t t = 0; t < T; ++t) {
      float* row = local.f32() + t * W;
      for (const ColumnRange& c : columns[s]) {
        for (int64_t j = 0; j < c.width; ++j) row[c.begin + j] += from[j];
        from += c.width;
      }
    }
  }
  return absl::OkStatus();
}

absl::Status ContextHeadsOnDevice(int64_t num_heads, int64_t num_kv_heads, int size) {
  if (num_kv_heads % size == 0) return absl::OkStatus();
  return absl::UnimplementedError(absl::StrCat(
      "learner.context_parallel_attention = ulysses on CUDA needs learner.context_parallel "
      "dividing the ", num_kv_heads, " key/value heads (each rank its own: summing a shared "
      "head's gradients over ranks runs on the CPU only), found learner.context_parallel = ",
      size));
}

}  // namespace prl
