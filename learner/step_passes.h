// The parts of a learner step (learner/train_step.h) shared by the one-model step and the joint
// step of a run of adapters (learner/joint_step.h): a micro-batch in the model's terms, the
// totals every rank agrees on before any backward, a rank's running sums and their reduction,
// the reference's log-probs and a pass's loss gradient. Internal to learner/.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "learner/fsdp.h"
#include "learner/losses.h"
#include "learner/rollouts.h"
#include "learner/train_step.h"
#include "model/context_parallel.h"
#include "model/packed_batch.h"

namespace prl::learner {

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

// The micro-batch of samples[indices] (none: a pass that trains nothing, one token).
MicroBatch BuildMicroBatch(absl::Span<const TrainSample> samples, const std::vector<int>& indices,
                           const ModelConfig& config, MoeRouting routing, int64_t learner_version);

// What every rank must agree on before any backward: the loss's denominators (trained tokens
// and sequences of the whole step) and the number of micro-batch passes (every rank runs the
// same number; a rank with fewer micro-batches runs empty ones).
struct StepTotals {
  LossNormalizer normalizer;
  int64_t passes = 0;
  double input_tokens = 0;  // of the step's samples, all ranks (the empty passes have none)
};

absl::StatusOr<StepTotals> AgreeTotals(FsdpModel& model, absl::Span<const TrainSample> samples,
                                       const std::vector<std::vector<int>>& plan, bool counts);

// Every sample's routes, where it has any, fit the model (its MoE layers and top-k).
absl::Status CheckRoutes(absl::Span<const TrainSample> samples, const ModelConfig& config);

// This rank's running sums of one step, reduced over the ranks at its end.
struct RankSums {
  LossStats loss;
  double input_tokens = 0;
  double routed_tokens = 0, route_mismatches = 0;                // current weights
  double lagged_routed_tokens = 0, lagged_route_mismatches = 0;  // older weights
  double lag_sum = 0, lag_count = 0, lag_max = 0;                // learner version - token version
  double router_aux_loss = 0;                  // token-weighted over the step's micro-batches
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
                          const ModelConfig& config, RankSums* sums);

// loss.kl: the reference model's log-probs at the micro-batch's trained tokens (N), its pass
// run with both models' communication threads drained (the two never run collectives at once);
// empty without KL.
absl::StatusOr<std::vector<float>> ReferenceLogprobs(FsdpModel& model, const MicroBatch& mb,
                                                     const StepConfig& config,
                                                     const ContextShard* shard);

// The loss of a pass over `mb` from its forward's log-probs and entropies (T each): the
// gradient at the log-probs (T), the pass's terms added to `sums`. `ref`: ReferenceLogprobs.
// With `shard`, this rank's share of a context group's micro-batch.
absl::StatusOr<std::vector<float>> PassGradient(const MicroBatch& mb, const StepConfig& config,
                                                const LossNormalizer& normalizer,
                                                absl::Span<const float> logprobs,
                                                absl::Span<const float> entropies,
                                                absl::Span<const float> ref, RankSums* sums,
                                                const ContextShard* shard);

// The step's statistics over all ranks: sums, then maxima.
absl::Status ReduceStats(FsdpModel& model, const RankSums& r, StepStats* stats);

// Every sample fits the budget alone (the same answer on every rank, before any pass): the
// learner's admission refuses longer sequences, so this fails only for samples that bypass it.
absl::Status CheckBudget(const FsdpModel& model, absl::Span<const TrainSample> samples,
                         int64_t budget_bytes);

}  // namespace prl::learner
