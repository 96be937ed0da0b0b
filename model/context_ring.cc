#include "model/context_ring.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"

namespace prl {

namespace k = kernels;

RingSteps RingSteps::Make(const ContextPlan& plan) {
  RingSteps ring;
  ring.steps.resize(plan.size);
  for (int j = 0; j < plan.size; ++j) {
    const int from = (plan.rank - j + plan.size) % plan.size;  // whose block step j holds
    std::vector<std::vector<k::QueryPiece>>& calls = ring.steps[j];
    int64_t block_row = 0;
    int64_t last_seq = -1, run_of_seq = 0;
    for (const auto& [row, rows] : plan.rank_rows[from]) {
      // The run's sequence (its first gathered row) and its positions [b, e).
      const auto it = std::upper_bound(plan.kv_cu_seqlens.begin(), plan.kv_cu_seqlens.end(),
                                       static_cast<int32_t>(row));
      const int64_t seq = (it - plan.kv_cu_seqlens.begin()) - 1;
      const int64_t seq_row = plan.kv_cu_seqlens[seq];
      const int64_t b = row - seq_row, e = b + rows;
      run_of_seq = seq == last_seq ? run_of_seq + 1 : 0;
      last_seq = seq;
      for (const k::QueryPiece& q : plan.pieces) {
        if (q.kv0 != seq_row) continue;
        k::QueryPiece piece{q.row0, q.len, 0, block_row, 0};
        if (b == q.pos0) {
          // the query chunk itself: causal from its first position
        } else if (e <= q.pos0) {
          piece.keys = rows;  // wholly before: every key visible
        } else {
          continue;  // wholly after: none visible
        }
        if (static_cast<int64_t>(calls.size()) <= run_of_seq) calls.resize(run_of_seq + 1);
        calls[run_of_seq].push_back(piece);
      }
      block_row += rows;
    }
  }
  return ring;
}

namespace {

// block (plan.max_rows, 2 KV D) = the local rows' k|v columns of qkv, zero past them.
void TakeKeysValues(const Tensor& qkv, int64_t q_width, const Tensor& block) {
  const int64_t W = qkv.size(1), width = block.size(1), T = qkv.size(0);
  for (int64_t t = 0; t < T; ++t) {
    std::copy_n(qkv.f32() + t * W + q_width, width, block.f32() + t * width);
  }
  std::fill(block.f32() + T * width, block.f32() + block.numel(), 0.0f);
}

// out and lse (the running attention) merged with a call's partial part_out and part_lse at
// the rows of its pieces: softmax over the union of their keys.
void Merge(const std::vector<k::QueryPiece>& call, const Tensor& part_out, const Tensor& part_lse,
           const Tensor& out, const Tensor& lse, int64_t H, int64_t D) {
  for (const k::QueryPiece& p : call) {
    for (int64_t t = p.row0; t < p.row0 + p.len; ++t) {
      for (int64_t h = 0; h < H; ++h) {
        float& l = lse.f32()[t * H + h];
        const float m = part_lse.f32()[t * H + h];
        const float top = std::max(l, m);
        const float merged = top + std::log(std::exp(l - top) + std::exp(m - top));
        const float a = std::exp(l - merged), c = std::exp(m - merged);
        float* o = out.f32() + (t * H + h) * D;
        const float* po = part_out.f32() + (t * H + h) * D;
        for (int64_t d = 0; d < D; ++d) o[d] = a * o[d] + c * po[d];
        l = merged;
      }
    }
  }
}

absl::Status CheckBuffers(const ContextPlan& plan, const RingBuffers& b, const Tensor& qkv,
                          const k::AttentionShape& s, bool backward) {
  const int64_t T = qkv.size(0), width = 2 * s.num_kv_heads * s.head_dim;
  auto rows_of = [](const Tensor& t) { return t.defined() && t.rank == 2 ? t.size(0) : -1; };
  bool ok = rows_of(b.block) == plan.max_rows && rows_of(b.next) == plan.max_rows &&
            b.block.size(1) == width && b.next.size(1) == width && rows_of(b.part_out) >= T &&
            rows_of(b.part_lse) >= T;
  if (backward) {
    ok = ok && rows_of(b.dblock) == plan.max_rows && rows_of(b.dnext) == plan.max_rows &&
         rows_of(b.part_dqkv) >= T && b.part_dqkv.size(1) == qkv.size(1);
  }
  if (!ok || static_cast<int>(plan.rank_rows.size()) != plan.size) {
    return absl::InternalError(absl::StrCat("ring attention: buffers do not fit ", T,
                                            " local rows, ", plan.max_rows, " per block of ",
                                            width, " k|v columns"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status RingAttentionForward(const ContextPlan& plan, const RingSteps& ring,
                                  ContextExchange& exchange, const Tensor& qkv,
                                  const k::AttentionShape& shape, const RingBuffers& buffers,
                                  const Tensor& out, const Tensor& lse) {
  PRL_RETURN_IF_ERROR(CheckBuffers(plan, buffers, qkv, shape, /*backward=*/false));
  const int64_t T = qkv.size(0), H = shape.num_heads, D = shape.head_dim;
  Tensor block = buffers.block, next = buffers.next;
  TakeKeysValues(qkv, H * D, block);
  std::fill_n(out.f32(), T * H * D, 0.0f);
  std::fill_n(lse.f32(), T * H, -std::numeric_limits<float>::infinity());
  const Tensor part_out = buffers.part_out.Rows(0, T), part_lse = buffers.part_lse.Rows(0, T);
  for (int j = 0; j < plan.size; ++j) {
    for (const std::vector<k::QueryPiece>& call : ring.steps[j]) {
      if (call.empty()) continue;
      k::ContextAttentionForward(part_out, part_lse, qkv, block, call, shape);
      Merge(call, part_out, part_lse, out, lse, H, D);
    }
    if (j + 1 < plan.size) {
      PRL_RETURN_IF_ERROR(exchange.Shift(block, next));
      std::swap(block, next);
    }
  }
  return absl::OkStatus();
}

absl::Status RingAttentionBackward(const ContextPlan& plan, const RingSteps& ring,
                                   ContextExchange& exchange, const Tensor& dqkv,
                                   const Tensor& dout, const Tensor& qkv, const Tensor& out,
                                   const Tensor& lse, const k::AttentionShape& shape,
                                   const RingBuffers& buffers) {
  PRL_RETURN_IF_ERROR(CheckBuffers(plan, buffers, qkv, shape, /*backward=*/true));
  const int64_t T = qkv.size(0), W = qkv.size(1), q_width = shape.num_heads * shape.head_dim;
  const int64_t width = 2 * shape.num_kv_heads * shape.head_dim;
  Tensor block = buffers.block, next = buffers.next;
  Tensor dblock = buffers.dblock, dnext = buffers.dnext;
  TakeKeysValues(qkv, q_width, block);
  PRL_RETURN_IF_ERROR(ZeroTensor(dblock));
  for (int64_t t = 0; t < T; ++t) std::fill_n(dqkv.f32() + t * W, q_width, 0.0f);
  const Tensor part_dqkv = buffers.part_dqkv.Rows(0, T);
  for (int j = 0; j < plan.size; ++j) {
    for (const std::vector<k::QueryPiece>& call : ring.steps[j]) {
      if (call.empty()) continue;
      // The call's query gradients (its rows of part_dqkv's query columns) add to dqkv's; its
      // keys' and values' add to the block's.
      k::ContextAttentionBackward(part_dqkv, dblock, dout, qkv, block, out, lse, call, shape);
      for (const k::QueryPiece& p : call) {
        for (int64_t t = p.row0; t < p.row0 + p.len; ++t) {
          float* to = dqkv.f32() + t * W;
          const float* from = part_dqkv.f32() + t * W;
          for (int64_t c = 0; c < q_width; ++c) to[c] += from[c];
        }
      }
    }
    // The block goes on for the next step; its gradients go with it, and after the last step
    // once more, home to the block's owner.
    if (j + 1 < plan.size) {
      PRL_RETURN_IF_ERROR(exchange.Shift(block, next));
      std::swap(block, next);
    }
    PRL_RETURN_IF_ERROR(exchange.Shift(dblock, dnext));
    std::swap(dblock, dnext);
  }
  for (int64_t t = 0; t < T; ++t) {
    std::copy_n(dblock.f32() + t * width, width, dqkv.f32() + t * W + q_width);
  }
  return absl::OkStatus();
}

}  // namespace prl
