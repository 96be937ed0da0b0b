#include "learner/train_step.h"

#include <algorithm>
#include <chrono>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"

namespace prl::learner {

absl::Status ValidateStepConfig(const StepConfig& config) {
  PRL_RETURN_IF_ERROR(ValidateLossConfig(config.loss));
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
                                               int world_size, int64_t micro_batch_tokens) {
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
    if (batches.empty() || tokens + n > micro_batch_tokens) {
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
};

MicroBatch Build(absl::Span<const TrainSample> samples, const std::vector<int>& indices) {
  MicroBatch mb;
  mb.seq_offsets.push_back(0);
  std::vector<int32_t> sequence;
  for (int i : indices) {
    const TrainSample& s = samples[i];
    sequence.assign(s.prompt.begin(), s.prompt.end());
    sequence.insert(sequence.end(), s.completion.begin(), s.completion.end());
    const int32_t start = static_cast<int32_t>(mb.batch.num_tokens());
    mb.batch.AddScored(sequence, static_cast<int64_t>(s.prompt.size()));
    // Input position P - 1 + t predicts completion token t.
    for (size_t t = 0; t < s.completion.size(); ++t) {
      mb.target_positions.push_back(start + static_cast<int32_t>(s.prompt.size() - 1 + t));
      mb.mu.push_back(s.behaviour_logprobs[t]);
      mb.advantages.push_back(static_cast<float>(s.advantage));
    }
    mb.seq_offsets.push_back(static_cast<int32_t>(mb.mu.size()));
  }
  if (indices.empty()) {  // this rank has fewer micro-batches: a pass that trains nothing
    const int32_t token = 0, none = PackedBatch::kNoTarget;
    mb.batch.Add({&token, 1}, {&none, 1});
  }
  return mb;
}

}  // namespace

absl::StatusOr<StepStats> AccumulateGradients(FsdpModel& model,
                                              absl::Span<const TrainSample> samples,
                                              const StepConfig& config, int64_t learner_version) {
  PRL_RETURN_IF_ERROR(ValidateStepConfig(config));
  const auto start = std::chrono::steady_clock::now();
  const std::vector<std::vector<int>> plan =
      PlanMicroBatches(samples, model.rank(), model.world_size(), config.micro_batch_tokens);

  // Step totals, agreed by all ranks before any backward: trained tokens, sequences, the
  // number of micro-batches (every rank runs the same number of passes).
  double totals[3] = {0, 0, static_cast<double>(plan.size())};
  for (const auto& mb : plan) {
    for (int i : mb) {
      totals[0] += static_cast<double>(samples[i].completion.size());
      totals[1] += 1;
    }
  }
  PRL_RETURN_IF_ERROR(model.RunCollective([&](collective::Communicator& c) {
    PRL_RETURN_IF_ERROR(c.AllReduceHost({totals, 2}, collective::ReduceOp::kSum));
    return c.AllReduceHost({totals + 2, 1}, collective::ReduceOp::kMax);
  }));
  const LossNormalizer normalizer{totals[0], totals[1]};
  const int64_t passes = static_cast<int64_t>(totals[2]);

  StepStats stats;
  stats.micro_batches = passes;
  double input_tokens = 0, lag_sum = 0, lag_count = 0, lag_max = 0;
  std::vector<float> logprobs, dlogprobs, pi, dpi;
  for (int64_t p = 0; p < passes; ++p) {
    static const std::vector<int> kNone;
    const MicroBatch mb = Build(samples, p < static_cast<int64_t>(plan.size()) ? plan[p] : kNone);
    const int64_t T = mb.batch.num_tokens(), N = static_cast<int64_t>(mb.mu.size());
    logprobs.assign(T, 0.0f);
    PRL_RETURN_IF_ERROR(model.Forward(mb.batch, config.temperature, absl::MakeSpan(logprobs),
                                      /*for_backward=*/true));
    pi.resize(N);
    for (int64_t t = 0; t < N; ++t) pi[t] = logprobs[mb.target_positions[t]];
    dpi.assign(N, 0.0f);
    if (N > 0) {
      LossInputs in;
      in.pi = pi;
      in.mu = mb.mu;
      if (config.loss.kind == LossKind::kDecoupledPpo) in.prox = pi;  // see train_step.h
      in.advantages = mb.advantages;
      in.seq_offsets = mb.seq_offsets;
      PRL_RETURN_IF_ERROR(
          ComputeLoss(config.loss, in, normalizer, absl::MakeSpan(dpi), &stats.loss));
      input_tokens += static_cast<double>(T);
    }
    dlogprobs.assign(T, 0.0f);
    for (int64_t t = 0; t < N; ++t) dlogprobs[mb.target_positions[t]] = dpi[t];
    PRL_RETURN_IF_ERROR(model.Backward(dlogprobs));
    if (p < static_cast<int64_t>(plan.size())) {
      for (int i : plan[p]) {
        for (int64_t v : samples[i].versions) {
          const double lag = static_cast<double>(learner_version - v);
          lag_sum += lag;
          lag_count += 1;
          lag_max = std::max(lag_max, lag);
        }
      }
    }
  }

  // Statistics over all ranks: sums, then maxima.
  LossStats& l = stats.loss;
  double sums[] = {l.loss,       l.tokens,        l.sequences, l.ratio_sum,       l.clipped,
                   l.weight_sum, l.weight_sq_sum, l.kl_sum,    l.neg_logprob_sum, input_tokens,
                   lag_sum,      lag_count};
  double maxima[] = {l.ratio_max, lag_max};
  PRL_RETURN_IF_ERROR(model.RunCollective([&](collective::Communicator& c) {
    PRL_RETURN_IF_ERROR(c.AllReduceHost(sums, collective::ReduceOp::kSum));
    return c.AllReduceHost(maxima, collective::ReduceOp::kMax);
  }));
  l.loss = sums[0];
  l.tokens = sums[1];
  l.sequences = sums[2];
  l.ratio_sum = sums[3];
  l.clipped = sums[4];
  l.weight_sum = sums[5];
  l.weight_sq_sum = sums[6];
  l.kl_sum = sums[7];
  l.neg_logprob_sum = sums[8];
  l.ratio_max = maxima[0];
  stats.input_tokens = static_cast<int64_t>(sums[9]);
  stats.lag_mean = sums[11] > 0 ? sums[10] / sums[11] : 0;
  stats.lag_max = maxima[1];
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
