#include "learner/step_passes.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "learner/activation_budget.h"
#include "learner/reference_kl.h"

namespace prl::learner {

MicroBatch BuildMicroBatch(absl::Span<const TrainSample> samples, const std::vector<int>& indices,
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

absl::StatusOr<StepTotals> AgreeTotals(FsdpModel& model, absl::Span<const TrainSample> samples,
                                       const std::vector<std::vector<int>>& plan, bool counts) {
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

absl::StatusOr<std::vector<float>> ReferenceLogprobs(FsdpModel& model, const MicroBatch& mb,
                                                     const StepConfig& config,
                                                     const ContextShard* shard) {
  std::vector<float> ref;  // (N)
  if (!config.loss.kl.enabled()) return ref;
  const int64_t N = static_cast<int64_t>(mb.mu.size());
  std::vector<float> logprobs(mb.batch.num_tokens(), 0.0f);
  static const auto kDrain = [](collective::Communicator&) { return absl::OkStatus(); };
  PRL_RETURN_IF_ERROR(model.RunCollective(kDrain));
  PRL_RETURN_IF_ERROR(config.reference->Forward(
      mb.batch, config.temperature, absl::MakeSpan(logprobs), /*for_backward=*/false, shard));
  PRL_RETURN_IF_ERROR(config.reference->RunCollective(kDrain));
  ref.resize(N);
  for (int64_t t = 0; t < N; ++t) ref[t] = logprobs[mb.target_positions[t]];
  return ref;
}

absl::StatusOr<std::vector<float>> PassGradient(const MicroBatch& mb, const StepConfig& config,
                                                const LossNormalizer& normalizer,
                                                absl::Span<const float> logprobs,
                                                absl::Span<const float> entropies,
                                                absl::Span<const float> ref, RankSums* sums,
                                                const ContextShard* shard) {
  const int64_t T = mb.batch.num_tokens(), N = static_cast<int64_t>(mb.mu.size());
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
  return dlogprobs;
}

// The step's statistics over all ranks: sums, then maxima.
absl::Status ReduceStats(FsdpModel& model, const RankSums& r, StepStats* stats) {
  std::vector<double> loss = r.loss.ToVector();  // kNumSums sums, then ratio_max
  std::vector<double> sums(loss.begin(), loss.begin() + LossStats::kNumSums);
  sums.insert(sums.end(), {r.input_tokens, r.lag_sum, r.lag_count, r.routed_tokens,
                           r.route_mismatches, r.lagged_routed_tokens, r.lagged_route_mismatches,
                           r.router_aux_loss, r.entropy_sum, r.entropy_tokens});
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
    return absl::ResourceExhaustedError(
        absl::StrCat("sample ", i, ": a sequence of ", length,
                     " tokens needs learner.activation_budget_mb >= ", planner.BudgetMbFor(length),
                     " (", planner.DescribeLimits(budget_bytes), "); no pass of the step ran"));
  }
  return absl::OkStatus();
}

}  // namespace prl::learner
