// StepReport: what the learner reports after each optimizer step, in one schema. The learner
// role appends it to its report file as one JSON line per step (`learner.report_file`); prl
// run reads those lines for its progress and summary, and the learner's Prometheus metrics
// are set from the same struct. The reader is strict: a missing field, a field of the wrong
// type or an unknown field is an error naming it, so a renamed field cannot silently turn
// into a zero in a summary.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "learner/train_step.h"

namespace prl::learner {

// An evaluation set's round (docs/operations.md, "Evaluation during training") that finished
// before a step: the coordinator's newest, as its progress reply reported it.
struct EvalPoint {
  std::string set;  // the evaluation set's name
  int64_t version = 0;  // the learner version that opened the round
  double mean_reward = 0, pass_at_k = 0;
  int32_t k = 0;
  int64_t prompts = 0;
  bool operator==(const EvalPoint&) const = default;
};

struct StepReport {
  int64_t step = 0;        // optimizer steps taken, this one included
  int64_t version = 0;     // the weights' version after this step
  double unix_time = 0;    // when the step finished (s since the epoch)
  int64_t groups = 0;      // groups trained on
  int64_t samples = 0;     // their samples (including ones without a trainable token)
  double mean_reward = 0;  // over those samples
  double loss = 0;
  double mean_ratio = 0, max_ratio = 0;  // importance ratio pi/mu over trained tokens
  double clipped_fraction = 0;           // tokens whose gradient was clipped or masked
  double effective_sample_size = 0;      // of the importance weights, in (0, 1]
  double kl_behaviour_learner = 0;       // mean k3 estimate of KL(mu || pi)
  double entropy = 0;                    // mean -log pi of the sampled tokens (an estimate)
  // The policy's entropy: the mean over trained tokens of -sum_v pi(v) log pi(v) (StepStats).
  // Optional in ParseStepReport (0 when absent).
  double policy_entropy = 0;
  // learner.kl_coef > 0: the mean KL estimate of the policy to the reference model at the
  // trained tokens (StepStats::reference_kl; learner.kl_estimator). Optional (0 when absent).
  double reference_kl = 0;
  double grad_norm = 0;                  // global L2 norm before clipping
  double lr = 0;
  double lag_mean = 0, lag_max = 0;  // learner version minus token versions (versions)
  int64_t trained_tokens = 0, input_tokens = 0, completion_tokens = 0;
  // Qwen3-MoE: completion tokens with the actor's routes sampled with this step's weights, and
  // the share of them whose recomputed experts differ (the train/inference routing mismatch);
  // the same over tokens of older weights (where the policy's change moves routes too).
  // Optional in ParseStepReport (0 when absent).
  int64_t routed_tokens = 0;
  double route_mismatch_fraction = 0;
  int64_t lagged_routed_tokens = 0;
  double lagged_route_mismatch_fraction = 0;
  // Qwen3-MoE: the load-balancing loss (StepStats::router_aux_loss). Optional (0 when absent).
  double router_aux_loss = 0;
  // Agentic episodes: the share of the step's samples in which the environment answered at
  // least once (the calculator was called, the game went on). Optional (0 when absent).
  double multi_turn_fraction = 0;
  // The longest completion trained on (tokens): what a sync-mode step waited for. Optional in
  // ParseStepReport (0 when absent, as in reports written before it existed).
  int64_t completion_tokens_max = 0;
  // The largest pass workspace (activations, logits chunk, backward scratch) of the step on any
  // rank, bytes (StepStats::peak_activation_bytes). Optional (0 when absent).
  int64_t peak_activation_bytes = 0;
  double step_seconds = 0, publish_seconds = 0;
  // Groups not trained, in this step (since the previous report): too stale to train on
  // (dropped or re-queued); of prompts this learner's lineage had already trained on,
  // acknowledged untrained (learner/prompt_ledger.h); stale ones whose prompts went back to
  // the coordinator to be generated again.
  int64_t dropped_stale = 0, duplicate_groups = 0, stale_requeued = 0;
  // Groups whose rewards were all equal (learner.drop_uniform_groups, DAPO's dynamic
  // sampling): acknowledged untrained, their prompts done; others took their place in the step.
  // Optional in ParseStepReport (0 when absent), as is its total.
  int64_t dropped_uniform = 0;
  // The same since this learner process started (what Prometheus counters mirror). Optional
  // in ParseStepReport (0 when absent, as in reports written before they existed).
  int64_t dropped_stale_total = 0, duplicate_groups_total = 0, stale_requeued_total = 0;
  int64_t dropped_uniform_total = 0;
  // Evaluation rounds that finished since the previous report (the learner role fills them in
  // from the coordinator's progress replies). Optional in ParseStepReport, an array of objects
  // {"set", "version", "mean_reward", "pass_at_k", "k", "prompts"}; absent when empty.
  std::vector<EvalPoint> evals;
};

// Fills the loss, ratio, token and timing fields from a training step's result.
void SetStepResult(const StepResult& result, double lr, StepReport* report);

// One line of JSON, fields in declaration order.
std::string StepReportToJson(const StepReport& report);
// The inverse; errors name the field, the expected type and what was found.
absl::StatusOr<StepReport> ParseStepReport(absl::string_view json_line);

}  // namespace prl::learner
