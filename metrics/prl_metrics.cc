#include "metrics/prl_metrics.h"

#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

#ifndef PRL_VERSION_STRING
#error "PRL_VERSION_STRING is set by metrics/CMakeLists.txt"
#endif

namespace prl::metrics {
namespace {

using prometheus::BuildCounter;
using prometheus::BuildGauge;
using prometheus::BuildHistogram;
using prometheus::Counter;
using prometheus::Family;
using prometheus::Gauge;
using prometheus::Histogram;
using prometheus::Labels;
using prometheus::Registry;

// Bucket upper bounds (see the header for why each set). Literals, not computed, so that the
// `le` labels print exactly.
const Histogram::BucketBoundaries& RolloutLengthBuckets() {  // 16 .. 262144 tokens, x2
  static const auto* b = new Histogram::BucketBoundaries{
      16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072, 262144};
  return *b;
}
const Histogram::BucketBoundaries& RewardBuckets() {  // -1 .. 1, step 0.25
  static const auto* b =
      new Histogram::BucketBoundaries{-1, -0.75, -0.5, -0.25, 0, 0.25, 0.5, 0.75, 1};
  return *b;
}
const Histogram::BucketBoundaries& LagBuckets() {  // versions
  static const auto* b = new Histogram::BucketBoundaries{0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64};
  return *b;
}
const Histogram::BucketBoundaries& TransferSecondsBuckets() {  // 10 ms .. 100 s
  static const auto* b = new Histogram::BucketBoundaries{0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1,
                                                         2.5,  5,     10,   25,  50,   100};
  return *b;
}
const Histogram::BucketBoundaries& SwapStallBuckets() {  // 0.5 ms .. 10 s
  static const auto* b = new Histogram::BucketBoundaries{
      0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10};
  return *b;
}
const Histogram::BucketBoundaries& StepSecondsBuckets() {  // 50 ms .. 1000 s
  static const auto* b = new Histogram::BucketBoundaries{0.05, 0.1, 0.25, 0.5, 1,   2.5, 5,
                                                         10,   25,  50,   100, 250, 500, 1000};
  return *b;
}

Family<Counter>& CounterFamily(Registry& registry, const char* name, const char* help) {
  return BuildCounter().Name(name).Help(help).Register(registry);
}
Counter& AddCounter(Registry& registry, const char* name, const char* help,
                    const Labels& labels = {}) {
  return CounterFamily(registry, name, help).Add(labels);
}
Family<Gauge>& GaugeFamily(Registry& registry, const char* name, const char* help) {
  return BuildGauge().Name(name).Help(help).Register(registry);
}
Gauge& AddGauge(Registry& registry, const char* name, const char* help, const Labels& labels = {}) {
  return GaugeFamily(registry, name, help).Add(labels);
}
Histogram& AddHistogram(Registry& registry, const char* name, const char* help,
                        const Histogram::BucketBoundaries& buckets) {
  return BuildHistogram().Name(name).Help(help).Register(registry).Add({}, buckets);
}

Gauge& MoeRouteMismatch(Registry& registry, const char* weights) {
  return AddGauge(registry, "prl_moe_route_mismatch_ratio",
                  "Qwen3-MoE: share of the last step's routed completion tokens whose recomputed "
                  "experts differ from the actor's, by the weights they were sampled with "
                  "(current: this step's; lagged: older).",
                  {{"weights", weights}});
}

Counter& DroppedGroups(Registry& registry, const char* reason) {
  return AddCounter(registry, "prl_replay_groups_dropped_total",
                    "Groups dropped, by reason (stale: older than max_lag; full: drop-oldest "
                    "policy).",
                    {{"reason", reason}});
}

}  // namespace

absl::string_view Version() { return PRL_VERSION_STRING; }

void AdvanceCounterTo(Counter& counter, double total) {
  const double delta = total - counter.Value();
  if (delta > 0) counter.Increment(delta);
}

absl::string_view RoleName(Role role) {
  switch (role) {
    case Role::kCoordinator:
      return "coordinator";
    case Role::kActor:
      return "actor";
    case Role::kLearner:
      return "learner";
    case Role::kReplay:
      return "replay";
  }
  return "unknown";
}

ProcessMetrics::ProcessMetrics(Registry& registry, Role role)
    : build_info(
          AddGauge(registry, "prl_build_info",
                   "Always 1; labels carry the prl version and the process role.",
                   {{"version", std::string(Version())}, {"role", std::string(RoleName(role))}})),
      start_time_seconds(AddGauge(registry, "prl_process_start_time_seconds",
                                  "Unix time at which the process started, in seconds.")),
      weight_version(AddGauge(registry, "prl_weight_version",
                              "Weight version this process holds (actor: samples from; "
                              "learner: last published).",
                              {{"role", std::string(RoleName(role))}})) {
  build_info.Set(1);
  // Set once: a second ProcessMetrics on the same registry must not move the start time.
  if (start_time_seconds.Value() == 0) {
    start_time_seconds.Set(absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch()));
  }
}

CoordinatorMetrics::CoordinatorMetrics(Registry& registry)
    : prompt_sets_active(
          AddGauge(registry, "prl_prompt_sets_active", "Accepted prompt sets not yet fully done.")),
      prompts_pending(
          AddGauge(registry, "prl_prompts_pending", "Accepted prompts waiting for a lease.")),
      prompts_in_flight(AddGauge(registry, "prl_prompts_in_flight",
                                 "Prompts leased to an actor and not yet done.")),
      prompts_done(AddCounter(registry, "prl_prompts_done_total",
                              "Prompts whose group reached the replay buffer.")),
      leases_expired(AddCounter(registry, "prl_prompt_leases_expired_total",
                                "Prompt leases that expired; the prompt went back to pending.")),
      leases_throttled(AddCounter(registry, "prl_lease_requests_throttled_total",
                                  "Lease requests refused by the staleness budget.")),
      leases_dropped(AddCounter(registry, "prl_prompt_leases_dropped_total",
                                "Prompt leases re-queued because their actor's heartbeat no "
                                "longer listed them.")),
      leases_released(AddCounter(registry, "prl_prompt_leases_released_total",
                                 "Prompt leases their actor gave back with a reason.")),
      prompts_failed(AddCounter(registry, "prl_prompts_failed_total",
                                "Prompts given up on after coordinator.max_attempts failed "
                                "attempts.")),
      prompts_leased_(CounterFamily(registry, "prl_prompts_leased_total",
                                    "Prompt leases granted, by actor name.")),
      prompt_set_leases_(CounterFamily(registry, "prl_prompt_set_leases_total",
                                       "Prompt leases granted, by prompt set name.")),
      prompt_set_groups_completed_(CounterFamily(registry, "prl_prompt_set_groups_completed_total",
                                                 "Groups completed, by prompt set name.")),
      eval_mean_reward_(GaugeFamily(registry, "prl_eval_mean_reward",
                                    "Evaluation sets: the newest round's mean reward, by set name.")),
      eval_pass_at_k_(GaugeFamily(registry, "prl_eval_pass_at_k",
                                  "Evaluation sets: the newest round's pass@k (k = samples per "
                                  "prompt), by set name.")),
      eval_version_(GaugeFamily(registry, "prl_eval_version",
                                "Evaluation sets: the learner version that opened the newest "
                                "finished round, by set name.")),
      eval_rounds_(CounterFamily(registry, "prl_eval_rounds_total",
                                 "Evaluation sets: rounds finished, by set name.")),
      adapter_version_(GaugeFamily(registry, "prl_adapter_version",
                                   "A run of adapters: the learner's newest version, by adapter.")),
      adapter_groups_trained_(GaugeFamily(registry, "prl_adapter_groups_trained",
                                          "A run of adapters: groups the learner trained on, by "
                                          "adapter.")),
      adapter_groups_unconsumed_(GaugeFamily(registry, "prl_adapter_groups_unconsumed",
                                             "A run of adapters: groups completed and not yet "
                                             "trained on, by adapter.")),
      adapter_prompts_in_flight_(GaugeFamily(registry, "prl_adapter_prompts_in_flight",
                                             "A run of adapters: prompts leased now, by adapter.")),
      adapter_prompt_sets_running_(GaugeFamily(registry, "prl_adapter_prompt_sets_running",
                                               "A run of adapters: running prompt sets, by "
                                               "adapter.")),
      tenant_prompts_in_flight_(GaugeFamily(registry, "prl_tenant_prompts_in_flight",
                                            "A run of adapters: prompts leased now, by tenant.")),
      tenant_groups_completed_(CounterFamily(registry, "prl_tenant_groups_completed_total",
                                             "A run of adapters: training groups completed, by "
                                             "tenant.")),
      tenant_samples_(CounterFamily(registry, "prl_tenant_samples_total",
                                    "A run of adapters: samples of training groups completed, by "
                                    "tenant.")),
      tenant_groups_trained_(GaugeFamily(registry, "prl_tenant_groups_trained",
                                         "A run of adapters: groups the tenant's adapters' "
                                         "learners trained on, by tenant.")),
      requests_rejected_(CounterFamily(registry, "prl_coordinator_requests_rejected_total",
                                       "Authenticated requests refused for their content, by "
                                       "reason.")) {
  for (const char* reason : {"completion_not_lease_holder", "progress_out_of_bounds",
                             "group_without_lease", "release_not_lease_holder"}) {
    RequestsRejected(reason);
  }
}

Counter& CoordinatorMetrics::PromptsLeased(absl::string_view actor) {
  return prompts_leased_.Add({{"actor", std::string(actor)}});
}

Counter& CoordinatorMetrics::PromptSetLeases(absl::string_view set) {
  return prompt_set_leases_.Add({{"set", std::string(set)}});
}

Counter& CoordinatorMetrics::PromptSetGroupsCompleted(absl::string_view set) {
  return prompt_set_groups_completed_.Add({{"set", std::string(set)}});
}

CoordinatorMetrics::Eval CoordinatorMetrics::EvalOf(absl::string_view set) {
  const std::map<std::string, std::string> labels = {{"set", std::string(set)}};
  return {eval_mean_reward_.Add(labels), eval_pass_at_k_.Add(labels), eval_version_.Add(labels),
          eval_rounds_.Add(labels)};
}

CoordinatorMetrics::Adapter CoordinatorMetrics::AdapterOf(absl::string_view adapter) {
  adapters_.insert(std::string(adapter));
  const std::map<std::string, std::string> labels = {{"adapter", std::string(adapter)}};
  return {adapter_version_.Add(labels), adapter_groups_trained_.Add(labels),
          adapter_groups_unconsumed_.Add(labels), adapter_prompts_in_flight_.Add(labels),
          adapter_prompt_sets_running_.Add(labels)};
}

CoordinatorMetrics::Tenant CoordinatorMetrics::TenantOf(absl::string_view tenant) {
  const std::map<std::string, std::string> labels = {{"tenant", std::string(tenant)}};
  return {tenant_prompts_in_flight_.Add(labels), tenant_groups_completed_.Add(labels),
          tenant_samples_.Add(labels), tenant_groups_trained_.Add(labels)};
}

void CoordinatorMetrics::KeepAdapters(const std::set<std::string>& live) {
  for (auto it = adapters_.begin(); it != adapters_.end();) {
    if (live.count(*it) > 0) {
      ++it;
      continue;
    }
    const Adapter a = AdapterOf(*it);
    adapter_version_.Remove(&a.version);
    adapter_groups_trained_.Remove(&a.groups_trained);
    adapter_groups_unconsumed_.Remove(&a.groups_unconsumed);
    adapter_prompts_in_flight_.Remove(&a.prompts_in_flight);
    adapter_prompt_sets_running_.Remove(&a.prompt_sets_running);
    it = adapters_.erase(it);
  }
}

Counter& CoordinatorMetrics::RequestsRejected(absl::string_view reason) {
  return requests_rejected_.Add({{"reason", std::string(reason)}});
}

ActorMetrics::ActorMetrics(Registry& registry)
    : tokens_generated(AddCounter(registry, "prl_tokens_generated_total",
                                  "Completion tokens sampled; rate() is decode tokens/s.")),
      prefill_tokens(AddCounter(registry, "prl_prefill_tokens_total",
                                "Prompt tokens prefilled (prefix-cache hits excluded).")),
      rollout_length_tokens(AddHistogram(registry, "prl_rollout_length_tokens",
                                         "Completion tokens per finished sample.",
                                         RolloutLengthBuckets())),
      reward(
          AddHistogram(registry, "prl_reward", "Reward of each finished sample.", RewardBuckets())),
      groups_pending(AddGauge(registry, "prl_groups_pending",
                              "Groups leased to this actor and not yet started.")),
      groups_in_flight(
          AddGauge(registry, "prl_groups_in_flight", "Groups being generated or scored.")),
      groups_done(
          AddCounter(registry, "prl_groups_done_total", "Groups written to the replay buffer.")),
      eval_groups(AddCounter(registry, "prl_actor_eval_groups_total",
                             "Groups of evaluation sets: scored and reported, never written to "
                             "the replay buffer.")),
      leases_lost(AddCounter(registry, "prl_actor_leases_lost_total",
                             "Groups dropped because their lease was no longer this actor's.")),
      sequences_running(AddGauge(registry, "prl_engine_sequences_running",
                                 "Sequences in the engine's running batch.")),
      sequences_waiting(AddGauge(registry, "prl_engine_sequences_waiting",
                                 "Sequences queued in the engine, not yet running.")),
      preemptions(AddCounter(registry, "prl_engine_preemptions_total",
                             "Running sequences preempted for want of KV-cache blocks.")),
      kv_cache_used_bytes(AddGauge(registry, "prl_kv_cache_used_bytes",
                                   "KV-cache bytes in blocks that hold tokens.")),
      kv_cache_capacity_bytes(
          AddGauge(registry, "prl_kv_cache_capacity_bytes", "KV-cache bytes allocated.")),
      rollouts_finished_(CounterFamily(registry, "prl_rollouts_finished_total",
                                       "Finished samples, by finish reason.")),
      reward_failures_(CounterFamily(registry, "prl_reward_failures_total",
                                     "Samples whose reward could not be computed, by reason.")),
      episode_turns(AddHistogram(registry, "prl_episode_turns",
                                 "Model turns per finished agentic episode.",
                                 {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024})),
      environment_latency_seconds(AddHistogram(
          registry, "prl_environment_latency_seconds",
          "One environment call (StartEpisode, Step, EndEpisode), retries included.",
          {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 50, 100})),
      episode_model_tokens(AddCounter(registry, "prl_episode_tokens_total",
                                      "Completion tokens of finished episodes, by source.",
                                      {{"source", "model"}})),
      episode_environment_tokens(AddCounter(registry, "prl_episode_tokens_total",
                                            "Completion tokens of finished episodes, by source.",
                                            {{"source", "environment"}})),
      episode_context_tokens(
          AddCounter(registry, "prl_episode_context_tokens_total",
                     "Context tokens a sample had computed when its next turn started.")),
      episode_context_kept_tokens(
          AddCounter(registry, "prl_episode_context_kept_tokens_total",
                     "Of those, the tokens the KV cache still held (not computed again).")),
      episode_groups_waiting_environment(
          AddGauge(registry, "prl_episode_groups_waiting_environment",
                   "Episode groups waiting for their environment to come back.")),
      leases_reclaimed(AddCounter(registry, "prl_actor_leases_reclaimed_total",
                                  "Groups given back for other prompt sets' fair share.")),
      agent_call_latency_seconds(AddHistogram(
          registry, "prl_agent_call_latency_seconds",
          "One call to the actor's OpenAI-compatible endpoint, arrival to answer.",
          {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 50, 100})),
      agent_calls_per_episode(AddHistogram(registry, "prl_agent_calls_per_episode",
                                           "Endpoint calls of each finished agent episode.",
                                           {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024})),
      agent_splits(AddCounter(registry, "prl_agent_splits_total",
                              "Agent calls that rewrote the history: one more record each.")),
      environment_errors_(CounterFamily(registry, "prl_environment_errors_total",
                                        "Episode groups failed by their environment, by reason.")),
      agent_call_errors_(CounterFamily(registry, "prl_agent_call_errors_total",
                                       "Agent calls answered with an error, by reason.")),
      agent_errors_(CounterFamily(registry, "prl_agent_errors_total",
                                  "Agent groups failed by their agent, by reason.")) {
  for (const char* reason : {"stop", "length", "abort"}) RolloutsFinished(reason);
  for (const char* reason : {"timeout", "error", "unavailable"}) RewardFailures(reason);
  for (absl::StatusCode code : {absl::StatusCode::kUnavailable, absl::StatusCode::kDeadlineExceeded,
                                absl::StatusCode::kInvalidArgument, absl::StatusCode::kUnknown}) {
    EnvironmentErrors(code);
    AgentErrors(code);
  }
  for (absl::StatusCode code :
       {absl::StatusCode::kInvalidArgument, absl::StatusCode::kFailedPrecondition,
        absl::StatusCode::kResourceExhausted, absl::StatusCode::kUnauthenticated,
        absl::StatusCode::kUnknown}) {
    AgentCallErrors(code);
  }
}

namespace {

const char* FailureReason(absl::StatusCode code) {
  return code == absl::StatusCode::kUnavailable        ? "unavailable"
         : code == absl::StatusCode::kDeadlineExceeded ? "timeout"
         : code == absl::StatusCode::kInvalidArgument  ? "malformed"
                                                       : "error";
}

}  // namespace

Counter& ActorMetrics::EnvironmentErrors(absl::StatusCode code) {
  return environment_errors_.Add({{"reason", FailureReason(code)}});
}

Counter& ActorMetrics::AgentErrors(absl::StatusCode code) {
  return agent_errors_.Add({{"reason", FailureReason(code)}});
}

Counter& ActorMetrics::AgentCallErrors(absl::StatusCode code) {
  const char* reason = code == absl::StatusCode::kInvalidArgument      ? "invalid"
                       : code == absl::StatusCode::kFailedPrecondition ? "busy"
                       : code == absl::StatusCode::kResourceExhausted  ? "limit"
                       : code == absl::StatusCode::kUnauthenticated    ? "ended"
                                                                       : "error";
  return agent_call_errors_.Add({{"reason", reason}});
}

Counter& ActorMetrics::RolloutsFinished(absl::string_view reason) {
  return rollouts_finished_.Add({{"reason", std::string(reason)}});
}

Counter& ActorMetrics::RewardFailures(absl::string_view reason) {
  return reward_failures_.Add({{"reason", std::string(reason)}});
}

WeightSyncMetrics::WeightSyncMetrics(Registry& registry)
    : publish_seconds(AddHistogram(registry, "prl_weight_publish_seconds",
                                   "From the end of an optimizer step until its weights are "
                                   "available to subscribers, in seconds.",
                                   TransferSecondsBuckets())),
      transfer_bytes(AddCounter(registry, "prl_weight_transfer_bytes_total",
                                "Weight bytes sent (publisher) or received (subscriber).")),
      transfer_seconds(AddHistogram(registry, "prl_weight_transfer_seconds",
                                    "From the first byte of a weight version to having it all, "
                                    "in seconds.",
                                    TransferSecondsBuckets())),
      swap_stall_seconds(AddHistogram(registry, "prl_weight_swap_stall_seconds",
                                      "Time decoding was paused to swap weights in, in seconds.",
                                      SwapStallBuckets())) {}

ReplayMetrics::ReplayMetrics(Registry& registry)
    : used_bytes(
          AddGauge(registry, "prl_replay_used_bytes", "Replay ring bytes holding live groups.")),
      capacity_bytes(
          AddGauge(registry, "prl_replay_capacity_bytes", "Replay ring capacity in bytes.")),
      groups_ready(
          AddGauge(registry, "prl_replay_groups_ready", "Committed groups waiting for a reader.")),
      groups_leased(AddGauge(registry, "prl_replay_groups_leased",
                             "Groups taken by a reader and not yet acknowledged.")),
      groups_written(AddCounter(registry, "prl_replay_groups_written_total",
                                "Groups committed to the replay buffer.")),
      bytes_written(AddCounter(registry, "prl_replay_bytes_written_total",
                               "Bytes committed to the replay buffer.")),
      groups_redelivered(AddCounter(registry, "prl_replay_groups_redelivered_total",
                                    "Leases that expired or whose reader died.")),
      dropped_stale(DroppedGroups(registry, "stale")),
      dropped_full(DroppedGroups(registry, "full")),
      dropped_uniform(DroppedGroups(registry, "uniform")),
      dropped_prompts_waiting(AddGauge(
          registry, "prl_replay_dropped_prompts_waiting",
          "Prompts of groups dropped for room (drop_oldest) not yet handed back to be re-run.")),
      dropped_prompts_overwritten(AddCounter(
          registry, "prl_replay_dropped_prompts_overwritten_total",
          "Prompts of dropped groups overwritten before a learner handed them back (lost).")) {}

QuarantineMetrics::QuarantineMetrics(Registry& registry)
    : dead_lettered_(CounterFamily(registry, "prl_replay_groups_dead_lettered_total",
                                   "Groups dead-lettered for bad input instead of being trained "
                                   "on, by reason.")) {
  for (absl::string_view reason : kDeadLetterReasons) DeadLettered(reason);
}

Counter& QuarantineMetrics::DeadLettered(absl::string_view reason) {
  return dead_lettered_.Add({{"reason", std::string(reason)}});
}

IngestMetrics::IngestMetrics(Registry& registry)
    : groups(AddCounter(registry, "prl_replay_ingest_groups_total",
                        "Groups pushed to this replay ingest and written into a replay segment.")),
      records(AddCounter(registry, "prl_replay_ingest_records_total",
                         "Records (samples) of the groups this replay ingest wrote.")) {}

LearnerMetrics::LearnerMetrics(Registry& registry, absl::string_view loss_name)
    : step_seconds(AddHistogram(registry, "prl_learner_step_seconds",
                                "Wall time of one learner step, from taking the batch to the "
                                "end of the optimizer update, in seconds.",
                                StepSecondsBuckets())),
      steps(AddCounter(registry, "prl_learner_steps_total", "Optimizer steps taken.")),
      tokens(AddCounter(registry, "prl_learner_tokens_total",
                        "Tokens trained on; rate() is training tokens/s.")),
      samples(AddCounter(registry, "prl_learner_samples_total", "Samples trained on.")),
      sample_max_lag_versions(AddHistogram(registry, "prl_sample_max_lag_versions",
                                           "Per trained sample: learner version minus its "
                                           "oldest token version.",
                                           LagBuckets())),
      sample_mean_lag_versions(AddHistogram(registry, "prl_sample_mean_lag_versions",
                                            "Per trained sample: mean over its tokens of "
                                            "learner version minus token version.",
                                            LagBuckets())),
      step_max_lag_versions(AddGauge(registry, "prl_learner_step_max_lag_versions",
                                     "Largest sample max lag in the last step, in versions.")),
      max_lag_versions(AddGauge(registry, "prl_learner_max_lag_versions",
                                "The staleness budget (learner.max_lag), in versions.")),
      loss(AddGauge(registry, "prl_learner_loss", "Normalised loss of the last step.",
                    {{"loss", std::string(loss_name)}})),
      importance_ratio_mean(AddGauge(registry, "prl_importance_ratio_mean",
                                     "Mean over the last step's tokens of pi / mu.")),
      importance_ratio_max(AddGauge(registry, "prl_importance_ratio_max",
                                    "Max over the last step's tokens of pi / mu.")),
      clipped_tokens_ratio(AddGauge(registry, "prl_importance_clipped_tokens_ratio",
                                    "Fraction of the last step's tokens whose gradient the loss "
                                    "clipped, truncated or masked.",
                                    {{"loss", std::string(loss_name)}})),
      importance_weight_ess_ratio(AddGauge(registry, "prl_importance_weight_ess_ratio",
                                           "Effective sample size of the applied importance "
                                           "weights over the token count.",
                                           {{"loss", std::string(loss_name)}})),
      logprob_mismatch_kl(AddGauge(registry, "prl_logprob_mismatch_kl",
                                   "Train/inference mismatch: mean k3 estimate of "
                                   "KL(mu || pi) over the last step's tokens, in nats.")),
      moe_route_mismatch_ratio(MoeRouteMismatch(registry, "current")),
      moe_lagged_route_mismatch_ratio(MoeRouteMismatch(registry, "lagged")),
      entropy(AddGauge(registry, "prl_learner_entropy",
                       "Mean -log pi of the last step's sampled tokens, in nats.")),
      policy_entropy(AddGauge(registry, "prl_learner_policy_entropy",
                              "The policy's entropy at the last step's trained tokens (mean of "
                              "-sum_v pi(v) log pi(v)), in nats.")),
      reference_kl(AddGauge(registry, "prl_learner_reference_kl",
                            "The mean KL estimate of the policy to the reference model at the "
                            "last step's trained tokens (learner.kl_coef > 0), in nats.")),
      peak_activation_bytes(AddGauge(
          registry, "prl_learner_peak_activation_bytes",
          "The largest pass workspace (activations, logits chunk, backward scratch) of the last "
          "step on any learner rank, in bytes.")),
      grad_norm(AddGauge(registry, "prl_learner_grad_norm",
                         "Global gradient norm of the last step, before clipping.")),
      learning_rate(
          AddGauge(registry, "prl_learner_learning_rate", "Learning rate of the last step.")) {}

AdapterLearnerMetrics::AdapterLearnerMetrics(Registry& registry)
    : steps_(CounterFamily(registry, "prl_adapter_learner_steps_total",
                           "A run of adapters: optimizer steps the learner took, by adapter.")),
      samples_(CounterFamily(registry, "prl_adapter_learner_samples_total",
                             "A run of adapters: samples trained on, by adapter.")),
      tokens_(CounterFamily(registry, "prl_adapter_learner_tokens_total",
                            "A run of adapters: tokens trained on, by adapter.")),
      version_(GaugeFamily(registry, "prl_adapter_learner_version",
                           "A run of adapters: the adapter's newest published version.")),
      reward_mean_(GaugeFamily(registry, "prl_adapter_learner_reward_mean",
                               "A run of adapters: the last step's mean sample reward, by "
                               "adapter.")),
      loss_(GaugeFamily(registry, "prl_adapter_learner_loss",
                        "A run of adapters: the last step's normalised loss, by adapter.")),
      lag_mean_(GaugeFamily(registry, "prl_adapter_learner_lag_mean_versions",
                            "A run of adapters: the last step's mean sample lag (versions), by "
                            "adapter.")),
      step_seconds_(GaugeFamily(registry, "prl_adapter_learner_step_seconds",
                                "A run of adapters: the last step's wall time, by adapter.")),
      groups_waiting_(GaugeFamily(registry, "prl_adapter_learner_groups_waiting",
                                  "A run of adapters: groups in the adapter's replay segment or "
                                  "taken for a step, by adapter.")) {}

void AdapterLearnerMetrics::Update(absl::string_view adapter,
                                   const std::function<void(const Adapter&)>& update) {
  std::lock_guard<std::mutex> lock(mu_);
  update(OfLocked(adapter));
}

AdapterLearnerMetrics::Adapter AdapterLearnerMetrics::OfLocked(absl::string_view adapter) {
  adapters_.insert(std::string(adapter));
  const std::map<std::string, std::string> labels = {{"adapter", std::string(adapter)}};
  return {steps_.Add(labels),    samples_.Add(labels),      tokens_.Add(labels),
          version_.Add(labels),  reward_mean_.Add(labels),  loss_.Add(labels),
          lag_mean_.Add(labels), step_seconds_.Add(labels), groups_waiting_.Add(labels)};
}

void AdapterLearnerMetrics::Keep(const std::set<std::string>& live) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> gone;
  for (const std::string& name : adapters_) {
    if (live.count(name) == 0) gone.push_back(name);
  }
  for (const std::string& name : gone) {
    const Adapter a = OfLocked(name);
    steps_.Remove(&a.steps);
    samples_.Remove(&a.samples);
    tokens_.Remove(&a.tokens);
    version_.Remove(&a.version);
    reward_mean_.Remove(&a.reward_mean);
    loss_.Remove(&a.loss);
    lag_mean_.Remove(&a.lag_mean_versions);
    step_seconds_.Remove(&a.step_seconds);
    groups_waiting_.Remove(&a.groups_waiting);
    adapters_.erase(name);
  }
}

}  // namespace prl::metrics
