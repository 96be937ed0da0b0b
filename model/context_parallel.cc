#include "model/context_parallel.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"

namespace prl {

std::vector<PositionRun> ContextRuns(int64_t length, int rank, int size) {
  std::vector<PositionRun> runs;
  const int64_t chunks = 2 * static_cast<int64_t>(size);
  for (const int64_t chunk : {static_cast<int64_t>(rank), chunks - 1 - rank}) {
    const PositionRun run{chunk * length / chunks, (chunk + 1) * length / chunks};
    if (run.end > run.begin) runs.push_back(run);
  }
  return runs;
}

std::vector<int64_t> ShareRows(const PackedBatch& full, int rank, int size) {
  std::vector<int64_t> rows;
  for (int64_t s = 0; s < full.num_seqs(); ++s) {
    const int64_t start = full.cu_seqlens[s];
    for (const PositionRun& run : ContextRuns(full.cu_seqlens[s + 1] - start, rank, size)) {
      for (int64_t p = run.begin; p < run.end; ++p) rows.push_back(start + p);
    }
  }
  return rows;
}

PackedBatch ShardBatch(const PackedBatch& full, int rank, int size) {
  PackedBatch local;
  local.cu_seqlens = {0};
  const int64_t per_token = full.routes.empty() ? 0
                            : full.num_tokens() > 0
                                ? static_cast<int64_t>(full.routes.size()) / full.num_tokens()
                                : 0;
  for (int64_t s = 0; s < full.num_seqs(); ++s) {
    const int64_t start = full.cu_seqlens[s], length = full.cu_seqlens[s + 1] - start;
    const std::vector<PositionRun> runs = ContextRuns(length, rank, size);
    if (runs.empty()) continue;
    for (const PositionRun& run : runs) {
      local.tokens.insert(local.tokens.end(), full.tokens.begin() + start + run.begin,
                          full.tokens.begin() + start + run.end);
      local.targets.insert(local.targets.end(), full.targets.begin() + start + run.begin,
                           full.targets.begin() + start + run.end);
      if (per_token > 0) {
        local.routes.insert(local.routes.end(),
                            full.routes.begin() + (start + run.begin) * per_token,
                            full.routes.begin() + (start + run.end) * per_token);
      }
    }
    local.cu_seqlens.push_back(static_cast<int32_t>(local.tokens.size()));
  }
  if (local.tokens.empty()) {  // a share of nothing: one untrained token (ContextPlan pads it)
    local.tokens = {full.tokens.empty() ? 0 : full.tokens[0]};
    local.targets = {PackedBatch::kNoTarget};
    if (per_token > 0) local.routes.assign(per_token, PackedBatch::kRouted);
    local.cu_seqlens.push_back(1);
  }
  return local;
}

absl::StatusOr<ContextPlan> ContextPlan::Make(const ContextShard& shard, const PackedBatch& local,
                                              int64_t max_position_embeddings) {
  if (shard.exchange == nullptr) {
    return absl::InvalidArgumentError("context parallelism: no exchange for the group");
  }
  ContextPlan plan;
  plan.rank = shard.exchange->rank();
  plan.size = shard.exchange->size();
  plan.rank_rows.resize(plan.size);
  plan.kv_cu_seqlens = {0};
  std::vector<int64_t> rows_of(plan.size, 0);
  int64_t local_seq = 0;
  for (size_t s = 0; s < shard.lengths.size(); ++s) {
    const int64_t length = shard.lengths[s];
    if (length < 1 || length > max_position_embeddings) {
      return absl::InvalidArgumentError(
          absl::StrCat("context parallelism: sequence ", s, " has ", length,
                       " tokens; expected 1 to max_position_embeddings = ",
                       max_position_embeddings));
    }
    const int64_t kv0 = plan.kv_rows;
    for (int r = 0; r < plan.size; ++r) {
      const std::vector<PositionRun> runs = ContextRuns(length, r, plan.size);
      for (const PositionRun& run : runs) {
        plan.rank_rows[r].emplace_back(kv0 + run.begin, run.end - run.begin);
        rows_of[r] += run.end - run.begin;
      }
      if (r != plan.rank || runs.empty()) continue;
      if (local_seq >= local.num_seqs()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "context parallelism: the share holds ", local.num_seqs(),
            " sequences, fewer than rank ", r, "'s runs of the ", shard.lengths.size(),
            " sequences need"));
      }
      int64_t row = local.cu_seqlens[local_seq];
      for (const PositionRun& run : runs) {
        plan.pieces.push_back({row, run.end - run.begin, run.begin, kv0});
        for (int64_t p = run.begin; p < run.end; ++p) {
          plan.positions.push_back(static_cast<int32_t>(p));
        }
        row += run.end - run.begin;
      }
      if (row != local.cu_seqlens[local_seq + 1]) {
        return absl::InvalidArgumentError(absl::StrCat(
            "context parallelism: the share's sequence ", local_seq, " has ",
            local.cu_seqlens[local_seq + 1] - local.cu_seqlens[local_seq], " tokens; rank ", r,
            " holds ", row - local.cu_seqlens[local_seq], " of sequence ", s));
      }
      ++local_seq;
    }
    plan.kv_rows += length;
    plan.kv_cu_seqlens.push_back(static_cast<int32_t>(plan.kv_rows));
  }
  // A rank that holds nothing runs one untrained token of its own (ShardBatch): its k|v row
  // joins the gathered rows after the sequences', where no other query reads it.
  for (int r = 0; r < plan.size; ++r) {
    if (rows_of[r] > 0) continue;
    plan.rank_rows[r].emplace_back(plan.kv_rows, 1);
    rows_of[r] = 1;
    if (r == plan.rank) {
      plan.pieces.push_back({0, 1, 0, plan.kv_rows});
      plan.positions.push_back(0);
      ++local_seq;
    }
    ++plan.kv_rows;
    plan.kv_cu_seqlens.push_back(static_cast<int32_t>(plan.kv_rows));
  }
  if (local_seq != local.num_seqs()) {
    return absl::InvalidArgumentError(
        absl::StrCat("context parallelism: the share holds ", local.num_seqs(),
                     " sequences, rank ", plan.rank, "'s runs ", local_seq));
  }
  plan.max_rows = *std::max_element(rows_of.begin(), rows_of.end());
  return plan;
}

absl::Status GatherKeysValues(const ContextPlan& plan, ContextExchange& exchange,
                              const Tensor& qkv, int64_t q_width, const Tensor& send,
                              const Tensor& recv, const Tensor& kv) {
  const int64_t W = qkv.size(1), width = W - q_width, T = qkv.size(0);
  float* out = send.f32();
  for (int64_t t = 0; t < T; ++t) {
    std::copy_n(qkv.f32() + t * W + q_width, width, out + t * width);
  }
  std::fill(out + T * width, out + plan.max_rows * width, 0.0f);
  PRL_RETURN_IF_ERROR(exchange.AllGather(send.Reshape({send.numel()}), recv.Reshape({recv.numel()})));
  for (int r = 0; r < plan.size; ++r) {
    const float* from = recv.f32() + r * plan.max_rows * width;
    for (const auto& [row, rows] : plan.rank_rows[r]) {
      std::copy_n(from, rows * width, kv.f32() + row * width);
      from += rows * width;
    }
  }
  return absl::OkStatus();
}

absl::Status ScatterKeyValueGrads(const ContextPlan& plan, ContextExchange& exchange,
                                  const Tensor& dkv, const Tensor& send, const Tensor& recv,
                                  const Tensor& dqkv, int64_t q_width) {
  const int64_t W = dqkv.size(1), width = W - q_width, T = dqkv.size(0);
  std::fill(send.f32(), send.f32() + send.numel(), 0.0f);
  for (int r = 0; r < plan.size; ++r) {
    float* to = send.f32() + r * plan.max_rows * width;
    for (const auto& [row, rows] : plan.rank_rows[r]) {
      std::copy_n(dkv.f32() + row * width, rows * width, to);
      to += rows * width;
    }
  }
  PRL_RETURN_IF_ERROR(
      exchange.ReduceScatter(send.Reshape({send.numel()}), recv.Reshape({recv.numel()})));
  for (int64_t t = 0; t < T; ++t) {
    std::copy_n(recv.f32() + t * width, width, dqkv.f32() + t * W + q_width);
  }
  return absl::OkStatus();
}

}  // namespace prl
