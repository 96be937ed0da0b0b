// The joint step of a run of adapters on one rank (docs/tenants.md): several adapters' steps in
// one set of passes over their shared frozen base, as Tinker batches its users' LoRA training.
//
// Each adapter's step is planned as its own (PlanMicroBatches over its samples; its loss
// normalised over its own step's trained tokens and sequences; its own statistics). Pass p
// packs micro-batch p of every adapter that has one into one batch, up to pass_tokens input
// tokens (and the activation budget), each adapter's LoRA on its own sequences
// (ModelParams::lora_segments): the frozen base's GEMMs, attention and LM head run once for all
// of them, each adapter's LoRA products and gradient its own. Then each adapter's optimizer
// steps. Each adapter's update is its separate TrainStep's, up to float summation order (the
// base's GEMMs over more rows): tests/reference checks it against the float64 reference.
//
// Which steps can be joint (CheckJointStep): LoRA models at world size 1 on one frozen base, on
// the CPU in fp32, without context parallelism, at one temperature, and without a Qwen3-MoE
// load-balancing coefficient (that loss would be over the joint batch, not each adapter's).
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "learner/fsdp.h"
#include "learner/optimizer.h"
#include "learner/rollouts.h"
#include "learner/train_step.h"

namespace prl::learner {

// One adapter's step: what TrainStep would be given.
struct AdapterStep {
  FsdpModel* model = nullptr;
  ShardedOptimizer* optimizer = nullptr;
  absl::Span<const TrainSample> samples;  // at least one
  const StepConfig* config = nullptr;
  int64_t learner_version = 0;
};

// One step's own errors (its settings, its samples' routes and lengths against its budget): what
// TrainStep would refuse it for, before any pass.
absl::Status CheckAdapterStep(const AdapterStep& step);

// Why these steps cannot be joint (the error names the step and what differs), or OK.
absl::Status CheckJointStep(absl::Span<const AdapterStep> steps);

// Each step's gradient into its model's (zeroed here) gradient shard, and its statistics, in
// order: AccumulateGradients for several adapters at once. pass_tokens (>= 1): the most input
// tokens one pass packs (a micro-batch larger than that alone is a pass of its own).
// StepStats::seconds is the joint step's; peak_activation_bytes the largest joint pass's.
absl::StatusOr<std::vector<StepStats>> AccumulateJointGradients(
    absl::Span<const AdapterStep> steps, int64_t pass_tokens);
// The same, then each adapter's optimizer step: TrainStep for several adapters at once.
absl::StatusOr<std::vector<StepResult>> TrainJointStep(absl::Span<const AdapterStep> steps,
                                                       int64_t pass_tokens);

}  // namespace prl::learner
