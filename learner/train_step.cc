#include "learner/train_step.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "learner/activation_budget.h"
#include "learner/reference_kl.h"
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

// A micro-batch in the model's terms, and where each trained token's log-prob lands.
struct MicroBatch {
  PackedBatch batch;
  std::vector<int32_t> target_positions;  // (N) positions in the packed batch
  std::vector<float> mu, advantages;      // (N)
  std::vector<int32_t> seq_offsets;       // (S + 1)
  // Completion tokens with recorded routes: their input position, the record's (Lm, K) ids,
  // and whether the actor sampled them with the weights this forward uses (no version given
  // counts as such).
  struct RecordedRoute {
    int32_t position;
    const uint8_t* ids;
    bool current;
  };
  std::vector<RecordedRoute> recorded_routes;
  // Context parallelism: sequences this share has trained tokens of but whose first trained
  // token another rank of the group holds (that rank counts them in the step's statistics), and
  // each sequence's trained tokens in the whole sequence (S; the sequence-mean normalization).
  double sequences_counted_elsewhere = 0;
  std::vector<int32_t> seq_trained_tokens;
  // (N) each trained token's chunk of its whole sequence (of the group's 2 C: ContextRuns), for
  // kl_penalty reward's return to go over the group.
  std::vector<int32_t> target_chunks;
};

MicroBatch Build(absl::Span<const TrainSample> samples, const std::vector<int>& indices,
                 const ModelConfig& config, MoeRouting routing, int64_t learner_version) {
  MicroBatch mb;
  const int64_t LK = config.num_moe_layers() * config.num_experts_per_tok;
  mb.seq_offsets.push_back(0);
  std::vector<int32_t> sequence;
  for (int i : indices) {
    const TrainSample& s = samples[i];
    sequence.assign(s.prompt.begin(), s.prompt.end());
    sequence.insert(sequence.end(), s.completion.begin(), s.completion.end());
    const int32_t start = static_cast<int32_t>(mb.batch.num_tokens());
    mb.batch.AddScored(sequence, static_cast<int64_t>(s.prompt.size()));
    // Input position P - 1 + t predicts completion token t; an environment's tokens are read,
    // never trained.
    for (size_t t = 0; t < s.completion.size(); ++t) {
      if (!s.trained(t)) continue;
      mb.target_positions.push_back(start + static_cast<int32_t>(s.prompt.size() - 1 + t));
      mb.mu.push_back(s.behaviour_logprobs[t]);
      mb.advantages.push_back(static_cast<float>(s.advantage));
    }
    mb.seq_offsets.push_back(static_cast<int32_t>(mb.mu.size()));
    if (LK == 0 || s.routes.empty()) continue;  // (shapes checked by CheckRoutes)
    for (size_t t = 0; t < s.completion.size(); ++t) {
      const bool current = s.versions.empty() || s.versions[t] == learner_version;
      mb.recorded_routes.push_back({start + static_cast<int32_t>(s.prompt.size() - 1 + t),
                                    s.routes.data() + t * LK, current});
    }
  }
  if (routing == MoeRouting::kReplay && !mb.recorded_routes.empty()) {
    mb.batch.routes.assign(mb.batch.num_tokens() * LK, PackedBatch::kRouted);
    for (const MicroBatch::RecordedRoute& r : mb.recorded_routes) {
      std::copy_n(r.ids, LK, mb.batch.routes.begin() + r.position * LK);
    }
  }
  if (indices.empty()) {  // this rank has fewer micro-batches: a pass that trains nothing
    const int32_t token = 0, none = PackedBatch::kNoTarget;
    mb.batch.Add({&token, 1}, {&none, 1});
  }
  return mb;
}

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

// What every rank must agree on before any backward: the loss's denominators (trained tokens
// and sequences of the whole step) and the number of micro-batch passes (every rank runs the
// same number; a rank with fewer micro-batches runs empty ones).
struct StepTotals {
  LossNormalizer normalizer;
  int64_t passes = 0;
  double input_tokens = 0;  // of the step's samples, all ranks (the empty passes have none)
};

absl::StatusOr<StepTotals> AgreeTotals(FsdpModel& model, absl::Span<const TrainSample> samples,
                                       const std::vector<std::vector<int>>& plan,
                                       bool counts) {
  double totals[4] = {0, 0, 0, static_cast<double>(plan.size())};
  for (const auto& mb : plan) {
    if (!counts) break;  // a context group's samples are counted by its first rank
    for (int i : mb) {
      const int64_t trained = samples[i].trained_tokens();
      totals[0] += static_cast<double>(trained);
      totals[1] += trained > 0 ? 1 : 0;
      totals[2] += static_cast<double>(samples[i].input_tokens());
    }
  }
  PRL_RETURN_IF_ERROR(model.RunCollective([&](collective::Communicator& c) {
    PRL_RETURN_IF_ERROR(c.AllReduceHost({totals, 3}, collective::ReduceOp::kSum));
    return c.AllReduceHost({totals + 3, 1}, collective::ReduceOp::kMax);
  }));
  return StepTotals{{totals[0], totals[1]}, static_cast<int64_t>(totals[3]), totals[2]};
}

// Every sample's routes, where it has any, fit the model (its MoE layers and top-k).
absl::Status CheckRoutes(absl::Span<const TrainSample> samples, const ModelConfig& config) {
  const int64_t Lm = config.num_moe_layers(), K = config.num_experts_per_tok;
  for (size_t i = 0; i < samples.size(); ++i) {
    const TrainSample& s = samples[i];
    if (s.routes.empty()) continue;
    if (s.route_layers != Lm || s.route_top_k != K ||
        static_cast<int64_t>(s.routes.size()) !=
            Lm * K * static_cast<int64_t>(s.completion.size())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "sample ", i, ": routes: expected ", s.completion.size(), " tokens x ", Lm,
          " MoE layers x top-", K, " (the model's), found route_layers ", s.route_layers,
          ", route_top_k ", s.route_top_k, ", ", s.routes.size(), " ids"));
    }
    for (uint8_t e : s.routes) {
      if (e >= config.num_experts) {
        return absl::InvalidArgumentError(absl::StrCat("sample ", i, ": routes: expert id ", e,
                                                       " of a model with ", config.num_experts,
                                                       " experts"));
      }
    }
  }
  return absl::OkStatus();
}

// This rank's running sums of one step, reduced over the ranks at its end.
struct RankSums {
  LossStats loss;
  double input_tokens = 0;
  double routed_tokens = 0, route_mismatches = 0;                // current weights
  double lagged_routed_tokens = 0, lagged_route_mismatches = 0;  // older weights
  double lag_sum = 0, lag_count = 0, lag_max = 0;  // learner version - token version
  double router_aux_loss = 0;  // token-weighted over the step's micro-batches
  double entropy_sum = 0, entropy_tokens = 0;  // the policy's entropy at trained tokens
  double peak_activation_bytes = 0;            // the largest pass's workspace

  void AddLags(absl::Span<const TrainSample> samples, const std::vector<int>& indices,
               int64_t learner_version) {
    for (int i : indices) {
      const TrainSample& s = samples[i];
      for (size_t t = 0; t < s.versions.size(); ++t) {
        if (!s.trained(t)) continue;  // an environment's token has no lag of its own
        const double lag = static_cast<double>(learner_version - s.versions[t]);
        lag_sum += lag;
        lag_count += 1;
        lag_max = std::max(lag_max, lag);
      }
    }
  }
};

// Adds the micro-batch's recorded tokens, and those the router sent elsewhere (as sets per
// layer), to the sums of tokens of the current weights or of older ones.
void CountRouteMismatches(const MicroBatch& mb, absl::Span<const uint8_t> recomputed,
                          const ModelConfig& config, RankSums* sums) {
  const int64_t Lm = config.num_moe_layers(), K = config.num_experts_per_tok;
  for (const MicroBatch::RecordedRoute& r : mb.recorded_routes) {
    const uint8_t* ids = r.ids;
    const int64_t position = r.position;
    bool differs = false;
    for (int64_t l = 0; l < Lm && !differs; ++l) {
      uint8_t a[kMaxExperts], b[kMaxExperts];  // K <= E <= 256
      std::copy_n(ids + l * K, K, a);
      std::copy_n(recomputed.data() + (position * Lm + l) * K, K, b);
      std::sort(a, a + K);
      std::sort(b, b + K);
      differs = !std::equal(a, a + K, b);
    }
    (r.current ? sums->routed_tokens : sums->lagged_routed_tokens) += 1;
    (r.current ? sums->route_mismatches : sums->lagged_route_mismatches) += differs ? 1 : 0;
  }
}

// One micro-batch: forward, the loss on its completion tokens, backward. `share`: the
// micro-batch's part of the step's input tokens (0 for a pass that trains nothing).
absl::Status RunPass(FsdpModel& model, const MicroBatch& mb, const StepConfig& config,
                     const LossNormalizer& normalizer, double share, RankSums* sums,
                     const ContextShard* shard) {
  const int64_t T = mb.batch.num_tokens(), N = static_cast<int64_t>(mb.mu.size());
  std::vector<float> logprobs(T, 0.0f);
  std::vector<float> ref;  // (N) the reference's log-probs at the trained tokens
  if (config.loss.kl.enabled()) {
    static const auto kDrain = [](collective::Communicator&) { return absl::OkStatus(); };
    PRL_RETURN_IF_ERROR(model.RunCollective(kDrain));
    PRL_RETURN_IF_ERROR(config.reference->Forward(
        mb.batch, config.temperature, absl::MakeSpan(logprobs), /*for_backward=*/false, shard));
    PRL_RETURN_IF_ERROR(config.reference->RunCollective(kDrain));
    ref.resize(N);
    for (int64_t t = 0; t < N; ++t) ref[t] = logprobs[mb.target_positions[t]];
  }
  PRL_RETURN_IF_ERROR(model.Forward(mb.batch, config.temperature, absl::MakeSpan(logprobs),
                                    /*for_backward=*/true, shard));
  CountRouteMismatches(mb, model.recomputed_routes(), model.config(), sums);
  // (the group's loss, on every rank of a context group: counted by its first)
  if (shard == nullptr || shard->exchange->rank() == 0) {
    sums->router_aux_loss += share * model.load_balancing_loss();
  }
  std::vector<float> pi(N), dpi(N, 0.0f);
  for (int64_t t = 0; t < N; ++t) pi[t] = logprobs[mb.target_positions[t]];
  // gspo over a group's shares: each whole sequence's sum of pi - mu, summed over the group
  // (every rank of the group runs this micro-batch, whatever its share holds).
  std::vector<double> log_ratio_sums;
  const int64_t S = static_cast<int64_t>(mb.seq_offsets.size()) - 1;
  if (shard != nullptr && config.loss.kind == LossKind::kGspo && S > 0) {
    log_ratio_sums.assign(S, 0.0);
    for (int64_t q = 0; q < S; ++q) {
      for (int32_t t = mb.seq_offsets[q]; t < mb.seq_offsets[q + 1]; ++t) {
        log_ratio_sums[q] += double{pi[t]} - double{mb.mu[t]};
      }
    }
    PRL_RETURN_IF_ERROR(shard->exchange->AllReduceHost(absl::MakeSpan(log_ratio_sums)));
  }
  // kl_penalty reward over a group's shares: each chunk's penalty sum, reduced over the group;
  // a token's return to go adds the later chunks other ranks hold.
  std::vector<double> penalty_after;
  const KlConfig& kl = config.loss.kl;
  if (shard != nullptr && kl.enabled() && kl.penalty == KlPenalty::kReward && S > 0) {
    const int C = shard->exchange->size(), rank = shard->exchange->rank(), chunks = 2 * C;
    std::vector<double> chunk_sums(S * chunks, 0.0);
    for (int64_t q = 0; q < S; ++q) {
      for (int32_t t = mb.seq_offsets[q]; t < mb.seq_offsets[q + 1]; ++t) {
        chunk_sums[q * chunks + mb.target_chunks[t]] +=
            kl.coef * KlEstimate(kl.estimator, double{mb.mu[t]} - ref[t]).value;
      }
    }
    PRL_RETURN_IF_ERROR(shard->exchange->AllReduceHost(absl::MakeSpan(chunk_sums)));
    penalty_after.assign(N, 0.0);
    for (int64_t q = 0; q < S; ++q) {
      for (int32_t t = mb.seq_offsets[q]; t < mb.seq_offsets[q + 1]; ++t) {
        for (int c = mb.target_chunks[t] + 1; c < chunks; ++c) {
          if (c == rank || c == chunks - 1 - rank) continue;  // this rank's: its own suffix
          penalty_after[t] += chunk_sums[q * chunks + c];
        }
      }
    }
  }
  const absl::Span<const float> entropies = model.entropies();
  for (int64_t t = 0; t < N; ++t) sums->entropy_sum += entropies[mb.target_positions[t]];
  sums->entropy_tokens += static_cast<double>(N);
  if (N > 0) {
    LossInputs in;
    in.pi = pi;
    in.mu = mb.mu;
    if (config.loss.kind == LossKind::kDecoupledPpo) in.prox = pi;  // see train_step.h
    in.advantages = mb.advantages;
    in.seq_offsets = mb.seq_offsets;
    in.ref = ref;
    in.seq_trained_tokens = mb.seq_trained_tokens;
    in.seq_log_ratio_sums = log_ratio_sums;
    in.penalty_after = penalty_after;
    PRL_RETURN_IF_ERROR(ComputeLoss(config.loss, in, normalizer, absl::MakeSpan(dpi), &sums->loss));
    sums->loss.sequences -= mb.sequences_counted_elsewhere;
    if (shard == nullptr) sums->input_tokens += static_cast<double>(T);  // (a group's: below)
  }
  std::vector<float> dlogprobs(T, 0.0f);
  for (int64_t t = 0; t < N; ++t) dlogprobs[mb.target_positions[t]] = dpi[t];
  return model.Backward(dlogprobs, config.router_aux_loss_coef * share);
}

// The step's statistics over all ranks: sums, then maxima.
absl::Status ReduceStats(FsdpModel& model, const RankSums& r, StepStats* stats) {
  std::vector<double> loss = r.loss.ToVector();  // kNumSums sums, then ratio_max
  std::vector<double> sums(loss.begin(), loss.begin() + LossStats::kNumSums);
  sums.insert(sums.end(),
              {r.input_tokens, r.lag_sum, r.lag_count, r.routed_tokens, r.route_mismatches,
               r.lagged_routed_tokens, r.lagged_route_mismatches, r.router_aux_loss,
               r.entropy_sum, r.entropy_tokens});
  double maxima[] = {loss.back(), r.lag_max, r.peak_activation_bytes};
  PRL_RETURN_IF_ERROR(model.RunCollective([&](collective::Communicator& c) {
    PRL_RETURN_IF_ERROR(c.AllReduceHost(absl::MakeSpan(sums), collective::ReduceOp::kSum));
    return c.AllReduceHost(maxima, collective::ReduceOp::kMax);
  }));
  std::copy(sums.begin(), sums.begin() + LossStats::kNumSums, loss.begin());
  loss.back() = maxima[0];
  stats->loss = LossStats::FromVector(loss);
  const double* extra = sums.data() + LossStats::kNumSums;
  stats->input_tokens = static_cast<int64_t>(extra[0]);
  stats->lag_mean = extra[2] > 0 ? extra[1] / extra[2] : 0;
  stats->lag_max = maxima[1];
  stats->peak_activation_bytes = static_cast<int64_t>(maxima[2]);
  stats->routed_tokens = static_cast<int64_t>(extra[3]);
  stats->route_mismatches = static_cast<int64_t>(extra[4]);
  stats->lagged_routed_tokens = static_cast<int64_t>(extra[5]);
  stats->lagged_route_mismatches = static_cast<int64_t>(extra[6]);
  stats->router_aux_loss = extra[7];
  stats->policy_entropy = extra[9] > 0 ? extra[8] / extra[9] : 0.0;
  stats->reference_kl = stats->loss.reference_kl();
  return absl::OkStatus();
}

// Every sample fits the budget alone (the same answer on every rank, before any pass): the
// learner's admission refuses longer sequences, so this fails only for samples that bypass it.
absl::Status CheckBudget(const FsdpModel& model, absl::Span<const TrainSample> samples,
                         int64_t budget_bytes) {
  const PassPlanner planner = PlannerOf(model);
  for (size_t i = 0; i < samples.size(); ++i) {
    const int64_t tokens = samples[i].input_tokens();
    if (planner.PassBytes(tokens, 1) <= budget_bytes) continue;
    const int64_t length = tokens + 1;
    return absl::ResourceExhaustedError(absl::StrCat(
        "sample ", i, ": a sequence of ", length, " tokens needs learner.activation_budget_mb >= ",
        planner.BudgetMbFor(length), " (", planner.DescribeLimits(budget_bytes),
        "); no pass of the step ran"));
  }
  return absl::OkStatus();
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
    MicroBatch mb = Build(samples, indices, model.config(), config.moe_routing, learner_version);
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
