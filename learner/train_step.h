// One learner step: the step's samples are split across ranks (balanced by tokens) and into
// micro-batches by a token budget; every micro-batch runs forward, the loss (learner/losses.h)
// and backward on the FSDP model; then one optimizer update.
//
// Normalisation is global: the trained-token (and sequence) totals of the whole step, over all
// ranks, are agreed before the first backward, so the gradient is the same whatever the world
// size and the micro-batch budget (up to float summation order).
//
// decoupled_ppo's proximal log-probs are the policy at the start of the step. prl takes one
// optimizer update per step, so that policy is the current weights and the forward pass's own
// log-probs, detached, are exactly the proximal log-probs: no second forward is needed.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "config/learner_kinds.h"
#include "learner/fsdp.h"
#include "learner/losses.h"
#include "learner/optimizer.h"
#include "learner/rollouts.h"

namespace prl::learner {

struct StepConfig {
  LossConfig loss;
  // Qwen3-MoE: the experts of completion tokens that carry the actor's routes
  // (TrainSample::routes; config/learner_kinds.h). Either way the step counts the completion
  // tokens whose recomputed routes differ from the recorded ones (StepStats).
  MoeRouting moe_routing = MoeRouting::kRecompute;
  // Qwen3-MoE: the load-balancing loss's coefficient (model/moe_layer.h; transformers'
  // router_aux_loss_coef), 0: off, as RL runs. The loss is computed over each micro-batch's
  // input tokens (prompts included), as transformers computes it over its batch, and the
  // micro-batches of all ranks are weighted by their share of the step's input tokens.
  double router_aux_loss_coef = 0.0;
  int64_t micro_batch_tokens = 4096;  // input tokens per micro-batch (a longer sequence alone)
  // learner/activation_budget.h: the most bytes a rank's pass may lay out (0: no budget). A
  // micro-batch over it is split; a sequence over it alone fails the step before any pass runs.
  int64_t activation_budget_bytes = 0;
  float temperature = 1.0f;           // the learner's log-probs use the sampling temperature
  // The frozen reference model of loss.kl (learner/reference_kl.h), sharded like the policy on
  // its own communicator; needed when loss.kl is enabled, else unused. Not owned. Each pass
  // runs it on the micro-batch first (its log-probs at the trained tokens), with both models'
  // communication threads drained, so that the two never run collectives at once.
  FsdpModel* reference = nullptr;
};
// The settings' values; the reference model loss.kl needs is checked when a step runs.
absl::Status ValidateStepConfig(const StepConfig& config);

struct StepStats {
  LossStats loss;                    // over all ranks
  int64_t input_tokens = 0;          // tokens run through the model, all ranks
  int64_t micro_batches = 0;         // per rank (the most any rank ran; the others padded)
  double lag_mean = 0, lag_max = 0;  // learner_version - token version, where versions given
  // Qwen3-MoE, all ranks: completion tokens with recorded routes, and those whose recomputed
  // experts (as a set, in any MoE layer) differ from the recorded ones; the first pair over
  // tokens the actor sampled with the very weights of this step (or without a version: the
  // train/inference mismatch, 0 in the fp32 CPU batch-invariant mode), the second over
  // tokens of older weights (where the policy's change moves routes too).
  int64_t routed_tokens = 0, route_mismatches = 0;
  int64_t lagged_routed_tokens = 0, lagged_route_mismatches = 0;
  // Qwen3-MoE: the load-balancing loss (without its coefficient), token-weighted over the
  // step's micro-batches as above; computed whether or not it is trained on.
  double router_aux_loss = 0;
  // The policy's entropy (nats) at the trained tokens, all ranks: the mean over them of
  // -sum_v pi(v) log pi(v) from the learner's log-softmax (Transformer::entropies).
  double policy_entropy = 0;
  // loss.kl enabled: the mean over the trained tokens of the KL estimator of the policy to the
  // reference (LossStats::reference_kl), all ranks; 0 when off.
  double reference_kl = 0;
  // The largest workspace (activations, logits chunk, backward scratch) a pass of the step laid
  // out on any rank (Transformer::last_pass_bytes).
  int64_t peak_activation_bytes = 0;
  double seconds = 0;
};

struct StepResult {
  StepStats stats;
  OptimizerStepResult optimizer;
};

// Whether a pass over `tokens` input tokens in `seqs` sequences fits the activation budget.
using PassFits = std::function<bool(int64_t tokens, int64_t seqs)>;

// The samples this rank trains on, grouped into micro-batches (indices into samples) of at most
// micro_batch_tokens input tokens and, with `fits`, passes that fit (a sample that exceeds
// either alone is a micro-batch of its own).
std::vector<std::vector<int>> PlanMicroBatches(absl::Span<const TrainSample> samples, int rank,
                                               int world_size, int64_t micro_batch_tokens,
                                               const PassFits& fits = nullptr);

// Collectives: every rank calls them with the same samples. Accumulate adds the step's
// gradient to the (zeroed by the caller) gradient shard.
absl::StatusOr<StepStats> AccumulateGradients(FsdpModel& model,
                                              absl::Span<const TrainSample> samples,
                                              const StepConfig& config, int64_t learner_version);
absl::StatusOr<StepResult> TrainStep(FsdpModel& model, ShardedOptimizer& optimizer,
                                     absl::Span<const TrainSample> samples,
                                     const StepConfig& config, int64_t learner_version);

}  // namespace prl::learner
