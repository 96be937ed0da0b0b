#include "learner/train_step.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "learner/activation_budget.h"
#include "learner/step_passes.h"
#include "model/context_parallel.h"

namespace prl::learner {

absl::Status ValidateStepConfig(const StepConfig& config) {
  PRL_RETURN_IF_ERROR(ValidateLossConfig(config.loss));
  if (!(config.router_aux_loss_coef >= 0) || !std::isfinite(config.router_aux_loss_coef)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "router_aux_loss_coef: expected a finite number >= 0 (0: off), found ",
        config.router_aux_loss_coef));
  }
  if (config.activation_budget_bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "activation_budget_bytes: expected >= 0 (0: no budget), found ",
        config.activation_budget_bytes));
  }
  if (config.micro_batch_tokens < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("micro_batch_tokens: expected >= 1, found ", config.micro_batch_tokens));
  }
  if (!(config.temperature > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("temperature: expected > 0, found ", config.temperature));
  }
  return absl::OkStatus();
}

std::vector<std::vector<int>> PlanMicroBatches(absl::Span<const TrainSample> samples, int rank,
                                               int world_size, int64_t micro_batch_tokens,
                                               const PassFits& fits) {
  // Each sample goes to the rank with the fewest tokens so far (lowest rank on ties): the
  // same plan on every rank.
  std::vector<int64_t> load(world_size, 0);
  std::vector<int> mine;
  for (int i = 0; i < static_cast<int>(samples.size()); ++i) {
    const int r = static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());
    load[r] += samples[i].input_tokens();
    if (r == rank) mine.push_back(i);
  }
  std::vector<std::vector<int>> batches;
  int64_t tokens = 0;
  for (int i : mine) {
    const int64_t n = samples[i].input_tokens();
    if (batches.empty() || tokens + n > micro_batch_tokens ||
        (fits && !fits(tokens + n, static_cast<int64_t>(batches.back().size()) + 1))) {
      batches.emplace_back();
      tokens = 0;
    }
    batches.back().push_back(i);
    tokens += n;
  }
  return batches;
}

namespace {

// Context parallelism: this rank's share of a micro-batch of whole sequences
// (model/context_parallel.h's ShardBatch), its trained tokens' positions in the share, and the
// shard the pass needs (the whole sequences' lengths).
struct ContextMicroBatch {
  MicroBatch mb;
  ContextShard shard;
};

ContextMicroBatch ShardMicroBatch(const MicroBatch& full, ContextExchange* exchange,
                                  ContextAttention attention) {
  ContextMicroBatch out;
  out.shard.exchange = exchange;
  out.shard.attention = attention;
  const int rank = exchange->rank(), size = exchange->size();
  out.mb.batch = ShardBatch(full.batch, rank, size);
  for (int64_t s = 0; s < full.batch.num_seqs(); ++s) {
    out.shard.lengths.push_back(full.batch.cu_seqlens[s + 1] - full.batch.cu_seqlens[s]);
  }
  std::vector<int32_t> local_of(full.batch.num_tokens(), -1);  // full position -> share's
  const std::vector<int64_t> rows = ShareRows(full.batch, rank, size);
  for (size_t i = 0; i < rows.size(); ++i) local_of[rows[i]] = static_cast<int32_t>(i);
  out.mb.seq_offsets.push_back(0);
  for (size_t q = 0; q + 1 < full.seq_offsets.size(); ++q) {
    out.mb.seq_trained_tokens.push_back(full.seq_offsets[q + 1] - full.seq_offsets[q]);
    const int32_t first = full.seq_offsets[q];
    if (first < full.seq_offsets[q + 1] && local_of[full.target_positions[first]] < 0) {
      for (int32_t t = first; t < full.seq_offsets[q + 1]; ++t) {
        if (local_of[full.target_positions[t]] >= 0) {
          out.mb.sequences_counted_elsewhere += 1;
          break;
        }
      }
    }
    const int64_t seq_start = full.batch.cu_seqlens[q];
    const int64_t length = full.batch.cu_seqlens[q + 1] - seq_start, chunks = 2 * size;
    for (int32_t t = full.seq_offsets[q]; t < full.seq_offsets[q + 1]; ++t) {
      const int32_t position = local_of[full.target_positions[t]];
      if (position < 0) continue;
      const int64_t p = full.target_positions[t] - seq_start;
      int32_t chunk = 0;  // chunk c holds positions [c n / 2C, (c + 1) n / 2C)
      while ((chunk + 1) * length / chunks <= p) ++chunk;
      out.mb.target_chunks.push_back(chunk);
      out.mb.target_positions.push_back(position);
      out.mb.mu.push_back(full.mu[t]);
      out.mb.advantages.push_back(full.advantages[t]);
    }
    out.mb.seq_offsets.push_back(static_cast<int32_t>(out.mb.mu.size()));
  }
  for (MicroBatch::RecordedRoute r : full.recorded_routes) {
    if (local_of[r.position] < 0) continue;
    r.position = local_of[r.position];
    out.mb.recorded_routes.push_back(r);
  }
  return out;
}

// One micro-batch: forward, the loss on its completion tokens, backward. `share`: the
// micro-batch's part of the step's input tokens (0 for a pass that trains nothing).
absl::Status RunPass(FsdpModel& model, const MicroBatch& mb, const StepConfig& config,
                     const LossNormalizer& normalizer, double share, RankSums* sums,
                     const ContextShard* shard) {
  PRL_ASSIGN_OR_RETURN(const std::vector<float> ref, ReferenceLogprobs(model, mb, config, shard));
  std::vector<float> logprobs(mb.batch.num_tokens(), 0.0f);
  PRL_RETURN_IF_ERROR(model.Forward(mb.batch, config.temperature, absl::MakeSpan(logprobs),
                                    /*for_backward=*/true, shard));
  CountRouteMismatches(mb, model.recomputed_routes(), model.config(), sums);
  // (the group's loss, on every rank of a context group: counted by its first)
  if (shard == nullptr || shard->exchange->rank() == 0) {
    sums->router_aux_loss += share * model.load_balancing_loss();
  }
  PRL_ASSIGN_OR_RETURN(const std::vector<float> dlogprobs,
                       PassGradient(mb, config, normalizer, logprobs, model.entropies(), ref,
                                    sums, shard));
  return model.Backward(dlogprobs, config.router_aux_loss_coef * share);
}

}  // namespace

absl::StatusOr<StepStats> AccumulateGradients(FsdpModel& model,
                                              absl::Span<const TrainSample> samples,
                                              const StepConfig& config, int64_t learner_version) {
  PRL_RETURN_IF_ERROR(ValidateStepConfig(config));
  if (config.loss.kl.enabled() && config.reference == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "kl_coef: ", config.loss.kl.coef, " needs a reference model, found none (the learner "
        "loads one when learner.kl_coef > 0)"));
  }
  PRL_RETURN_IF_ERROR(CheckRoutes(samples, model.config()));
  // Context parallelism: the ranks form groups of C consecutive ranks; the micro-batches are
  // planned over the groups, every rank of a group splitting the same ones.
  ContextExchange* context = model.context();
  const int group = context != nullptr ? context->size() : 1;
  const auto start = std::chrono::steady_clock::now();
  PassFits fits;
  if (config.activation_budget_bytes > 0) {
    PRL_RETURN_IF_ERROR(CheckBudget(model, samples, config.activation_budget_bytes));
    fits = [planner = PlannerOf(model), budget = config.activation_budget_bytes](
               int64_t tokens, int64_t seqs) { return planner.PassBytes(tokens, seqs) <= budget; };
  }
  const std::vector<std::vector<int>> plan = PlanMicroBatches(
      samples, model.rank() / group, model.world_size() / group, config.micro_batch_tokens, fits);
  const bool counts = context == nullptr || context->rank() == 0;
  PRL_ASSIGN_OR_RETURN(const StepTotals totals, AgreeTotals(model, samples, plan, counts));
  RankSums sums;
  static const std::vector<int> kNone;
  for (int64_t p = 0; p < totals.passes; ++p) {
    const std::vector<int>& indices = p < static_cast<int64_t>(plan.size()) ? plan[p] : kNone;
    double tokens = 0;
    for (int i : indices) tokens += static_cast<double>(samples[i].input_tokens());
    const double share = totals.input_tokens > 0 ? tokens / totals.input_tokens : 0.0;
    MicroBatch mb = BuildMicroBatch(samples, indices, model.config(), config.moe_routing, learner_version);
    if (context != nullptr) {
      if (counts && !mb.mu.empty()) sums.input_tokens += tokens;  // once per group
      ContextMicroBatch split = ShardMicroBatch(mb, context, model.context_attention());
      PRL_RETURN_IF_ERROR(
          RunPass(model, split.mb, config, totals.normalizer, share, &sums, &split.shard));
    } else {
      PRL_RETURN_IF_ERROR(RunPass(model, mb, config, totals.normalizer, share, &sums, nullptr));
    }
    sums.peak_activation_bytes =
        std::max(sums.peak_activation_bytes, static_cast<double>(model.last_pass_bytes()));
    if (counts) sums.AddLags(samples, indices, learner_version);
  }
  StepStats stats;
  stats.micro_batches = totals.passes;
  PRL_RETURN_IF_ERROR(ReduceStats(model, sums, &stats));
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return stats;
}

absl::StatusOr<StepResult> TrainStep(FsdpModel& model, ShardedOptimizer& optimizer,
                                     absl::Span<const TrainSample> samples,
                                     const StepConfig& config, int64_t learner_version) {
  const auto start = std::chrono::steady_clock::now();
  PRL_RETURN_IF_ERROR(model.ZeroGrad());
  StepResult result;
  PRL_ASSIGN_OR_RETURN(result.stats, AccumulateGradients(model, samples, config, learner_version));
  PRL_ASSIGN_OR_RETURN(result.optimizer, optimizer.Step());
  result.stats.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

}  // namespace prl::learner
