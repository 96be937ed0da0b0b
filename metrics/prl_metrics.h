// The catalog of prl's Prometheus metrics: one accessor struct per role, each registering its
// metrics on the process's registry (metrics/metrics_server.h) and handing out plain
// prometheus-cpp objects to set, increment and observe.
//
// Naming: every name starts with prl_, values are in base units (seconds, bytes; token and
// version counts are plain numbers named by what they count), counters end in _total, 0..1
// fractions end in _ratio. Labels have bounded cardinality only: role, reason, loss, actor index,
// prompt set name (at most 100); never prompt, group or sample ids.
//
// Histogram buckets are upper bounds (Prometheus `le`), each set documented where its metric
// is declared. Lag buckets are integers because a sample's max lag is an integer, so `le`
// counts are exact.
//
// Lifetime: the structs hold references into the registry, which must outlive them. Creating
// the same struct twice on one registry returns the same metrics (prometheus-cpp merges
// families of the same name and labels).
//
// Thread-safety: every metric object is safe to update from any thread. AdvanceCounterTo is
// the exception: one thread at a time may mirror a given counter.
#pragma once

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <functional>
#include <mutex>
#include <set>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace prl::metrics {

// The prl version that prl_build_info reports (the CMake project version).
absl::string_view Version();

// For a counter mirrored from a cumulative source (e.g. ReplayStats::dropped_stale): increments
// it by `total - counter.Value()`. A total below the counter's value (the source restarted) is
// ignored, so the counter stays monotonic and rate() stays right.
void AdvanceCounterTo(prometheus::Counter& counter, double total);

enum class Role { kCoordinator, kActor, kLearner, kReplay };
absl::string_view RoleName(Role role);  // "coordinator", "actor", "learner", "replay"

// Every prl process.
struct ProcessMetrics {
  // Also sets prl_build_info to 1 and prl_process_start_time_seconds to now.
  ProcessMetrics(prometheus::Registry& registry, Role role);

  // prl_build_info{version, role}: always 1; joins a process's series with its version and role.
  prometheus::Gauge& build_info;
  // prl_process_start_time_seconds: unix time at which the process built its metrics.
  prometheus::Gauge& start_time_seconds;
  // prl_weight_version{role}: the weight version this process holds (actor: the version it
  // samples from; learner: the last version it published; coordinator: the last version it was
  // told of). Lag across the fleet: max(learner) - min(actor).
  prometheus::Gauge& weight_version;
};

// The coordinator's prompt bookkeeping. A prompt yields exactly one group.
struct CoordinatorMetrics {
  explicit CoordinatorMetrics(prometheus::Registry& registry);

  // prl_prompt_sets_active: accepted prompt sets not yet fully done.
  prometheus::Gauge& prompt_sets_active;
  // prl_prompts_pending: accepted prompts waiting for a lease.
  prometheus::Gauge& prompts_pending;
  // prl_prompts_in_flight: prompts leased to an actor and not yet done.
  prometheus::Gauge& prompts_in_flight;
  // prl_prompts_done_total: prompts whose group reached the replay buffer.
  prometheus::Counter& prompts_done;
  // prl_prompt_leases_expired_total: leases that expired (actor dead or slow); the prompt went
  // back to pending.
  prometheus::Counter& leases_expired;
  // prl_lease_requests_throttled_total: lease requests refused by the staleness budget (the
  // learner could not consume more within max_lag versions).
  prometheus::Counter& leases_throttled;
  // prl_prompt_leases_dropped_total: leases re-queued because their actor's heartbeat no longer
  // listed them (the actor gave them up or restarted).
  prometheus::Counter& leases_dropped;
  // prl_prompt_leases_released_total: leases their actor gave back with a reason (its engine
  // refused the group, its reward failed); the prompt went back to pending (or failed).
  prometheus::Counter& leases_released;
  // prl_prompts_failed_total: prompts given up on after coordinator.max_attempts failed
  // attempts (released, expired, dropped); each is listed in its set's status.
  prometheus::Counter& prompts_failed;

  // prl_prompts_leased_total{actor}: leases granted to the actor of that name (its --name; the
  // pod's name in Kubernetes, so that it joins the actor's own series). One series per actor
  // that registered with this coordinator process.
  prometheus::Counter& PromptsLeased(absl::string_view actor);
  // prl_prompt_set_leases_total{set} / prl_prompt_set_groups_completed_total{set}: prompts
  // leased and groups completed per prompt set, by the set's name (sets that share a name share
  // a series; the first 100 names each, later ones under "_other", unnamed sets under
  // "_unnamed": coordinator/set_throughput.h). Their rates are the sets' throughput, in
  // proportion to the sets' weights while they have prompts to lease.
  prometheus::Counter& PromptSetLeases(absl::string_view set);
  prometheus::Counter& PromptSetGroupsCompleted(absl::string_view set);
  // Evaluation sets (docs/operations.md, "Evaluation during training"), by the set's name (the
  // first 100 names): the newest finished round's mean reward (prl_eval_mean_reward{set}),
  // pass@k (prl_eval_pass_at_k{set}) and learner version (prl_eval_version{set}), and the
  // rounds finished (prl_eval_rounds_total{set}).
  struct Eval {
    prometheus::Gauge& mean_reward;
    prometheus::Gauge& pass_at_k;
    prometheus::Gauge& version;
    prometheus::Counter& rounds;
  };
  Eval EvalOf(absl::string_view set);
  // A run of adapters (docs/tenants.md), by adapter name: the learner's newest version of it
  // (prl_adapter_version{adapter}), groups trained on (prl_adapter_groups_trained{adapter}) and
  // not yet (prl_adapter_groups_unconsumed{adapter}), prompts leased now
  // (prl_adapter_prompts_in_flight{adapter}) and running sets
  // (prl_adapter_prompt_sets_running{adapter}). A deleted adapter's series are dropped
  // (KeepAdapters).
  struct Adapter {
    prometheus::Gauge& version;
    prometheus::Gauge& groups_trained;
    prometheus::Gauge& groups_unconsumed;
    prometheus::Gauge& prompts_in_flight;
    prometheus::Gauge& prompt_sets_running;
  };
  Adapter AdapterOf(absl::string_view adapter);
  // Drops the series of the adapters AdapterOf made that are not in `live`.
  void KeepAdapters(const std::set<std::string>& live);
  // A run of adapters, by tenant (docs/tenants.md, "Fairness"; "_operator": sets submitted
  // without a tenant's token): prompts leased now (prl_tenant_prompts_in_flight{tenant}),
  // training groups and samples completed (prl_tenant_groups_completed_total{tenant},
  // prl_tenant_samples_total{tenant}: its rate is the tenant's samples/s) and groups its
  // adapters' learners trained on (prl_tenant_groups_trained{tenant}).
  struct Tenant {
    prometheus::Gauge& prompts_in_flight;
    prometheus::Counter& groups_completed;
    prometheus::Counter& samples;
    prometheus::Gauge& groups_trained;
  };
  Tenant TenantOf(absl::string_view tenant);
  // prl_coordinator_requests_rejected_total{reason}: authenticated requests refused for their
  // content (docs/security.md): "completion_not_lease_holder" (a completion from an actor that
  // does not hold the lease, or with a wrong nonce), "progress_out_of_bounds" (learner progress
  // beyond what was produced, or backwards), "group_without_lease" (a replay ingest asked about
  // a group no open lease made), "release_not_lease_holder" (a release of a lease the actor
  // does not hold). Exported from 0.
  prometheus::Counter& RequestsRejected(absl::string_view reason);

 private:
  prometheus::Family<prometheus::Counter>& prompts_leased_;
  prometheus::Family<prometheus::Counter>& prompt_set_leases_;
  prometheus::Family<prometheus::Counter>& prompt_set_groups_completed_;
  prometheus::Family<prometheus::Gauge>& eval_mean_reward_;
  prometheus::Family<prometheus::Gauge>& eval_pass_at_k_;
  prometheus::Family<prometheus::Gauge>& eval_version_;
  prometheus::Family<prometheus::Counter>& eval_rounds_;
  prometheus::Family<prometheus::Gauge>& adapter_version_;
  prometheus::Family<prometheus::Gauge>& adapter_groups_trained_;
  prometheus::Family<prometheus::Gauge>& adapter_groups_unconsumed_;
  prometheus::Family<prometheus::Gauge>& adapter_prompts_in_flight_;
  prometheus::Family<prometheus::Gauge>& adapter_prompt_sets_running_;
  std::set<std::string> adapters_;  // names AdapterOf made series for
  prometheus::Family<prometheus::Gauge>& tenant_prompts_in_flight_;
  prometheus::Family<prometheus::Counter>& tenant_groups_completed_;
  prometheus::Family<prometheus::Counter>& tenant_samples_;
  prometheus::Family<prometheus::Gauge>& tenant_groups_trained_;
  prometheus::Family<prometheus::Counter>& requests_rejected_;
};

// An actor: its generation, engine and reward.
struct ActorMetrics {
  explicit ActorMetrics(prometheus::Registry& registry);

  // prl_tokens_generated_total: completion tokens sampled; rate() is decode tokens/s.
  prometheus::Counter& tokens_generated;
  // prl_prefill_tokens_total: prompt tokens prefilled (prefix-cache hits excluded).
  prometheus::Counter& prefill_tokens;
  // prl_rollout_length_tokens: completion tokens per finished sample.
  // Buckets 16, 32, ..., 262144 (x2): responses from a few tokens to long agent episodes.
  prometheus::Histogram& rollout_length_tokens;
  // prl_reward: reward of each finished sample (the total, before advantage normalisation).
  // Buckets -1, -0.75, ..., 1 (step 0.25): verifier rewards in {0, 1} or {-1, 1} and partial
  // credit between; _sum / _count give the mean at any scale.
  prometheus::Histogram& reward;
  // prl_groups_pending: groups leased to this actor and not yet started, estimated from the
  // engine's waiting sequences over the mean group size of the groups in flight (a preempted
  // sample counts toward its group).
  prometheus::Gauge& groups_pending;
  // prl_groups_in_flight: groups being generated or scored.
  prometheus::Gauge& groups_in_flight;
  // prl_groups_done_total: groups written to the replay buffer.
  prometheus::Counter& groups_done;
  // prl_actor_eval_groups_total: groups of evaluation sets, scored and reported, never written.
  prometheus::Counter& eval_groups;
  // prl_actor_leases_lost_total: groups dropped because the coordinator refused them for a lease
  // this actor no longer holds (expired or re-queued); their prompts run again elsewhere.
  prometheus::Counter& leases_lost;
  // prl_engine_sequences_running / _waiting: sequences in the engine's running batch / queue.
  prometheus::Gauge& sequences_running;
  prometheus::Gauge& sequences_waiting;
  // prl_engine_preemptions_total: running sequences preempted for want of KV-cache blocks.
  prometheus::Counter& preemptions;
  // prl_kv_cache_used_bytes / prl_kv_cache_capacity_bytes: KV-cache blocks in use / allocated.
  prometheus::Gauge& kv_cache_used_bytes;
  prometheus::Gauge& kv_cache_capacity_bytes;

  // prl_rollouts_finished_total{reason}: finished samples by finish reason ("stop", "length",
  // "abort": inference_engine/sequence.h FinishReasonName; these three are exported from 0).
  prometheus::Counter& RolloutsFinished(absl::string_view reason);
  // prl_reward_failures_total{reason}: samples whose reward could not be computed ("timeout",
  // "error", "unavailable"; exported from 0).
  prometheus::Counter& RewardFailures(absl::string_view reason);

 private:  // (declared here: members are initialized in declaration order)
  prometheus::Family<prometheus::Counter>& rollouts_finished_;
  prometheus::Family<prometheus::Counter>& reward_failures_;

 public:

  // ---- Agentic episodes (docs/environments.md) ----
  // prl_episode_turns: model turns per finished episode. Buckets 1, 2, 4, ..., 1024.
  prometheus::Histogram& episode_turns;
  // prl_environment_latency_seconds: one environment call (StartEpisode, Step, EndEpisode),
  // retries included. Buckets 1 ms .. 100 s (1-2.5-5 steps).
  prometheus::Histogram& environment_latency_seconds;
  // prl_episode_tokens_total{source}: completion tokens of finished episodes, the model's
  // ("model") and the environments' replies ("environment").
  prometheus::Counter& episode_model_tokens;
  prometheus::Counter& episode_environment_tokens;
  // prl_episode_context_tokens_total / prl_episode_context_kept_tokens_total: at each next
  // turn, the context the sample had computed, and how much of it the KV cache still held
  // (their ratio is the share served from the cache; the rest was computed again).
  prometheus::Counter& episode_context_tokens;
  prometheus::Counter& episode_context_kept_tokens;
  // prl_episode_groups_waiting_environment: groups whose environment is down, waiting for it
  // to come back (actors.env_outage_s) before they start again.
  prometheus::Gauge& episode_groups_waiting_environment;
  // prl_actor_leases_reclaimed_total: groups given back at the coordinator's request so that
  // other prompt sets get a fair share of this actor (not failed attempts).
  prometheus::Counter& leases_reclaimed;
  // prl_environment_errors_total{reason}: episode groups failed by their environment
  // ("unavailable", "timeout", "malformed", "error"; exported from 0).
  prometheus::Counter& EnvironmentErrors(absl::StatusCode code);

  // ---- Agents (docs/agents.md) ----
  // prl_agent_call_latency_seconds: one call to the OpenAI-compatible endpoint, from its
  // arrival to its answer. Buckets 1 ms .. 100 s.
  prometheus::Histogram& agent_call_latency_seconds;
  // prl_agent_calls_per_episode: calls of each finished agent episode. Buckets 1, 2, 4, ..., 1024.
  prometheus::Histogram& agent_calls_per_episode;
  // prl_agent_splits_total: calls that could not continue their episode's trajectory (the agent
  // rewrote its history): each starts one more record.
  prometheus::Counter& agent_splits;
  // prl_agent_call_errors_total{reason}: calls answered with an error ("invalid" 400, "busy"
  // 409, "limit" 429, "ended" 401, "error"; exported from 0).
  prometheus::Counter& AgentCallErrors(absl::StatusCode code);
  // prl_agent_errors_total{reason}: agent groups failed by their agent ("unavailable",
  // "timeout", "malformed", "error"; exported from 0).
  prometheus::Counter& AgentErrors(absl::StatusCode code);

 private:
  prometheus::Family<prometheus::Counter>& environment_errors_;
  prometheus::Family<prometheus::Counter>& agent_call_errors_;
  prometheus::Family<prometheus::Counter>& agent_errors_;
};

// Weight synchronisation: the learner publishes, actors receive and swap. A process fills the
// side it plays; the other side stays at zero.
struct WeightSyncMetrics {
  explicit WeightSyncMetrics(prometheus::Registry& registry);

  // prl_weight_publish_seconds (publisher): from the end of an optimizer step until its version
  // is available to subscribers.
  // Buckets 0.01 .. 100 s (1-2.5-5 steps): shared memory takes milliseconds, gRPC to a remote
  // node seconds to a minute for large models.
  prometheus::Histogram& publish_seconds;
  // prl_weight_transfer_bytes_total (actor): weight bytes its subscriber received.
  prometheus::Counter& transfer_bytes;
  // prl_weight_transfer_seconds (actor): per version received, from its first byte to having
  // it all (versions received between two updates each count their mean). Buckets as
  // publish_seconds.
  prometheus::Histogram& transfer_seconds;
  // prl_weight_swap_stall_seconds (actor): time decoding was paused to swap weights in.
  // Buckets 0.0005 .. 10 s (1-2.5-5 steps): a swap of resident weights takes about a
  // millisecond; seconds mean the engine waited on a transfer.
  prometheus::Histogram& swap_stall_seconds;
};

// The replay buffer's occupancy and flow, exported by the process that owns the segment
// (mirror ReplayStats with Set and AdvanceCounterTo).
struct ReplayMetrics {
  explicit ReplayMetrics(prometheus::Registry& registry);

  // prl_replay_used_bytes / prl_replay_capacity_bytes: ring bytes holding live groups / total.
  prometheus::Gauge& used_bytes;
  prometheus::Gauge& capacity_bytes;
  // prl_replay_groups_ready: committed groups waiting for a reader.
  prometheus::Gauge& groups_ready;
  // prl_replay_groups_leased: groups taken by a reader and not yet acknowledged.
  prometheus::Gauge& groups_leased;
  // prl_replay_groups_written_total / prl_replay_bytes_written_total: groups and bytes committed.
  prometheus::Counter& groups_written;
  prometheus::Counter& bytes_written;
  // prl_replay_groups_redelivered_total: leases that expired or whose reader died.
  prometheus::Counter& groups_redelivered;
  // prl_replay_groups_dropped_total{reason="stale"}: groups older than a reader's max_lag.
  prometheus::Counter& dropped_stale;
  // prl_replay_groups_dropped_total{reason="full"}: groups dropped by the drop-oldest policy.
  prometheus::Counter& dropped_full;
  // prl_replay_groups_dropped_total{reason="uniform"}: groups whose rewards were all equal,
  // acknowledged untrained by the learner (learner.drop_uniform_groups: dynamic sampling).
  prometheus::Counter& dropped_uniform;
  // prl_replay_dropped_prompts_waiting: prompts of groups dropped for room, not yet handed back
  // to the coordinator (the learner hands them back to be generated again).
  prometheus::Gauge& dropped_prompts_waiting;
  // prl_replay_dropped_prompts_overwritten_total: such prompts overwritten before a learner took
  // them (the ring holds 1024): their prompts stay done untrained. Alert on any.
  prometheus::Counter& dropped_prompts_overwritten;
};

// The dead-letter reasons (replay/group_validation.h DeadLetterReasonName, checked equal by
// replay_quarantine_test): a token id outside the vocabulary, a sequence longer than the
// context, log-probs or versions not one per token, a log-prob not finite or above 0, a token
// version above the learner's, not a valid complete group, bytes failing their checksum.
inline constexpr absl::string_view kDeadLetterReasons[] = {
    "token_id", "context", "shape", "logprob", "future_version", "malformed", "corrupt", "routes"};

// Groups refused for bad input (replay/quarantine.h), by the learner before it trains or by
// the replay ingest before it writes; the process that checks exports them (mirror
// QuarantineCounts with AdvanceCounterTo).
struct QuarantineMetrics {
  explicit QuarantineMetrics(prometheus::Registry& registry);

  // prl_replay_groups_dead_lettered_total{reason}: groups written to the dead-letter file
  // instead of being trained on, by reason (replay/group_validation.h DeadLetterReasonName:
  // kDeadLetterReasons). Every reason is exported from 0, so that queries and alerts have a
  // series before the first one.
  prometheus::Counter& DeadLettered(absl::string_view reason);

 private:
  prometheus::Family<prometheus::Counter>& dead_lettered_;
};

// A replay ingest (`prl replay serve`): what it wrote for actors on other nodes. With a run of
// adapters' learner ranks on nodes of their own, each rank's ingest counts its adapters' groups.
struct IngestMetrics {
  explicit IngestMetrics(prometheus::Registry& registry);

  // prl_replay_ingest_groups_total / prl_replay_ingest_records_total: groups and records pushed
  // to this ingest and written into a replay segment (the run's, or their adapter's).
  prometheus::Counter& groups;
  prometheus::Counter& records;
};

// A learner rank (rank 0 exports the step's global statistics; all ranks may export timing).
struct LearnerMetrics {
  // `loss_name` (learner/losses.h, e.g. "ppo_clip") is the value of the {loss} labels below.
  LearnerMetrics(prometheus::Registry& registry, absl::string_view loss_name);

  // prl_learner_step_seconds: wall time of one step, from taking the batch to the end of the
  // optimizer update (publishing is prl_weight_publish_seconds).
  // Buckets 0.05 .. 1000 s (1-2.5-5 steps): tiny CPU models to large GPU steps.
  prometheus::Histogram& step_seconds;
  // prl_learner_steps_total: optimizer steps taken.
  prometheus::Counter& steps;
  // prl_learner_tokens_total: tokens trained on (the loss's token count); rate() is tokens/s.
  prometheus::Counter& tokens;
  // prl_learner_samples_total: samples (sequences) trained on.
  prometheus::Counter& samples;
  // prl_sample_max_lag_versions: per trained sample, learner version minus its oldest token
  // version. Buckets 0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64.
  prometheus::Histogram& sample_max_lag_versions;
  // prl_sample_mean_lag_versions: per trained sample, the mean over its tokens of learner
  // version minus token version. Buckets as sample_max_lag_versions.
  prometheus::Histogram& sample_mean_lag_versions;
  // prl_learner_step_max_lag_versions: the largest sample max lag in the last step.
  prometheus::Gauge& step_max_lag_versions;
  // prl_learner_max_lag_versions: the staleness budget (learner.max_lag); groups older are
  // dropped. Alerts compare the lags with it.
  prometheus::Gauge& max_lag_versions;
  // prl_learner_loss{loss}: the last step's normalised loss.
  prometheus::Gauge& loss;
  // prl_importance_ratio_mean / _max: mean and max over the last step's tokens of
  // r = pi / mu (learner over behaviour probability).
  prometheus::Gauge& importance_ratio_mean;
  prometheus::Gauge& importance_ratio_max;
  // prl_importance_clipped_tokens_ratio{loss}: fraction of the last step's tokens whose
  // gradient the loss clipped, truncated or masked.
  prometheus::Gauge& clipped_tokens_ratio;
  // prl_importance_weight_ess_ratio{loss}: effective sample size of the applied importance
  // weights over the token count, in (0, 1].
  prometheus::Gauge& importance_weight_ess_ratio;
  // prl_logprob_mismatch_kl: mean k3 estimate of KL(mu || pi) in nats, the train/inference
  // log-prob mismatch; near 0 when actor and learner agree.
  prometheus::Gauge& logprob_mismatch_kl;
  // prl_moe_route_mismatch_ratio{weights="current"|"lagged"}: Qwen3-MoE, the share of the last
  // step's completion tokens (those with the actor's routes) whose recomputed experts differ
  // from the actor's, in [0, 1]: over tokens sampled with the step's own weights (the
  // train/inference mismatch; 0 in the fp32 CPU batch-invariant mode, and without MoE), and
  // over tokens of older weights (the policy's change moves routes too).
  prometheus::Gauge& moe_route_mismatch_ratio;
  prometheus::Gauge& moe_lagged_route_mismatch_ratio;
  // prl_learner_entropy: mean -log pi of the sampled tokens, in nats.
  prometheus::Gauge& entropy;
  // prl_learner_policy_entropy: the policy's entropy at the last step's trained tokens (the
  // mean of -sum_v pi(v) log pi(v) from the learner's log-softmax), in nats.
  prometheus::Gauge& policy_entropy;
  // prl_learner_reference_kl: the mean KL estimate of the policy to the reference model at the
  // last step's trained tokens (learner.kl_coef > 0; learner.kl_estimator), in nats.
  prometheus::Gauge& reference_kl;
  // prl_learner_peak_activation_bytes: the largest pass workspace (activations, logits chunk,
  // backward scratch) of the last step on any rank (learner.activation_budget_mb bounds it).
  prometheus::Gauge& peak_activation_bytes;
  // prl_learner_grad_norm: global gradient norm before clipping.
  prometheus::Gauge& grad_norm;
  // prl_learner_learning_rate: learning rate of the last step.
  prometheus::Gauge& learning_rate;
};

// The learner of a run of adapters (roles/adapter_learner.h), by adapter name: each adapter's
// steps, samples and tokens trained (prl_adapter_learner_{steps,samples,tokens}_total{adapter}),
// its newest version (prl_adapter_learner_version{adapter}), its last step's mean sample reward,
// loss, mean lag and wall time (prl_adapter_learner_reward_mean, _loss, _lag_mean_versions,
// _step_seconds), and its groups waiting in its replay segment or taken for a step
// (prl_adapter_learner_groups_waiting{adapter}). A deleted adapter's series are dropped (Keep).
// Thread-safe: each trainer updates its own adapter's series through Update, under the lock Keep
// takes, so that a trainer still stepping after its adapter was dropped never touches a freed
// series (its update makes them again; the next Keep drops them).
class AdapterLearnerMetrics {
 public:
  explicit AdapterLearnerMetrics(prometheus::Registry& registry);
  struct Adapter {
    prometheus::Counter& steps;
    prometheus::Counter& samples;
    prometheus::Counter& tokens;
    prometheus::Gauge& version;
    prometheus::Gauge& reward_mean;
    prometheus::Gauge& loss;
    prometheus::Gauge& lag_mean_versions;
    prometheus::Gauge& step_seconds;
    prometheus::Gauge& groups_waiting;
  };
  // Runs `update` on the adapter's series (made on first use).
  void Update(absl::string_view adapter, const std::function<void(const Adapter&)>& update);
  // Drops the series of the adapters that are not in `live`.
  void Keep(const std::set<std::string>& live);

 private:
  Adapter OfLocked(absl::string_view adapter);  // under mu_

  prometheus::Family<prometheus::Counter>& steps_;
  prometheus::Family<prometheus::Counter>& samples_;
  prometheus::Family<prometheus::Counter>& tokens_;
  prometheus::Family<prometheus::Gauge>& version_;
  prometheus::Family<prometheus::Gauge>& reward_mean_;
  prometheus::Family<prometheus::Gauge>& loss_;
  prometheus::Family<prometheus::Gauge>& lag_mean_;
  prometheus::Family<prometheus::Gauge>& step_seconds_;
  prometheus::Family<prometheus::Gauge>& groups_waiting_;
  std::mutex mu_;
  std::set<std::string> adapters_;  // names with series
};

}  // namespace prl::metrics
