// Coordinator: prompt sets in, leased prompts out, completed groups back.
//
// Accepted prompt sets are durable (coordinator/prompt_log.h: appended and fsync'd before
// Submit returns) and survive a restart: Open replays the log, and every prompt whose group
// was not completed is pending again (leases are not durable: what was in flight is simply
// re-generated). A lease that is neither completed nor renewed by its actor's heartbeat within
// lease_ms is re-queued, so a crashed actor's prompts are re-run; a late Complete of a prompt
// that another actor already completed is answered accepted = false and changes nothing.
//
// max_lag budget (coordinator/lag_budget.h, which owns it): with groups_per_step > 0, prompts
// in flight plus groups completed but not yet trained on stay within (max_lag + 1) *
// groups_per_step, so that nothing generated can be older than max_lag learner versions when
// it is trained on; restarts of either side never stall it (docs/operations.md, "The lag
// budget").
//
// Lease lifecycle (coordinator/prompt_attempts.cc, coordinator/capacity.h): an actor declares
// its capacity at registration and is leased only prompts within it (others keep their place
// in the queue, coordinator/lease_scheduler.h). A lease ends with its group completed, or as a
// failed attempt: released by its actor (Release, with a reason), expired, or dropped from the
// actor's heartbeat. Failed
// attempts are logged; after max_attempts the prompt is failed with its last reason (visible in
// the set's status and events, never leased again) and a set whose prompts are all completed
// or failed is done. A prompt the learner hands back as too stale (Reopen) is a stale re-run,
// counted apart and failed after max_stale_reruns; its next lease requires the learner's
// newest weights.
//
// Weighted sets: sets with prompts to lease share the leases in proportion to their weights
// (SubmitPromptSetRequest.weight), by smooth weighted round robin within the lag budget, the
// actors' capacities and the fair share (coordinator/lease_scheduler.h).
//
// Evaluation sets (SubmitPromptSetRequest.eval; coordinator/eval_rounds.h, coordinator/
// evaluation.cc): never trained on; a round at submission and every N learner versions (an
// EvalRound record reopens the set's prompts), leased outside the lag budget within
// eval_max_actor_share of each actor's slots; each round's result in the set's status.
//
// Parts, each owning its state (a newcomer changes one of them, not the coordinator):
//   coordinator/prompt_sets.h   sets, prompts and their attempt counts, idempotency keys,
//                               events and texts, retention, the snapshot, and the
//                               evaluation sets' rounds (coordinator/eval_rounds.h)
//   coordinator/lease_scheduler.h  the pending prompts in lease order, the sets' weights
//                               and round-robin credits: which prompt is leased next
//   coordinator/lease_table.h   open leases: holder, deadline, expiry, renewal
//   coordinator/actor_table.h   registered actors: names, capacities, last heard from
//   coordinator/lag_budget.h    the learner's progress and the max_lag budget
//   coordinator/adapters.h      a run of tenants' adapters, each with its own lag budget
//                               (callers and quotas: coordinator/tenants.h, tenancy.cc)
// The coordinator owns the mutex, the prompt log and the rule "log first, then apply"
// (Apply: a record's effect on the parts); no fsync is waited for under the mutex (only a
// compaction, rare, writes its snapshot under it).
//
// Thread-safety: every method may be called from any thread (one mutex).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "coordinator/actor_table.h"
#include "coordinator/adapters.h"
#include "coordinator/fair_share.h"
#include "coordinator/lag_budget.h"
#include "coordinator/lease_scheduler.h"
#include "coordinator/lease_table.h"
#include "coordinator/prompt_log.h"
#include "coordinator/prompt_sets.h"
#include "coordinator/set_throughput.h"
#include "coordinator/tenants.h"
#include "core/service_defaults.h"
#include "prl/v1/prompt.pb.h"
#include "tokenizer/text_codec.h"

namespace prl::coordinator {

struct CoordinatorConfig {
  std::string log_path;  // the durable prompt log
  int64_t lease_ms = defaults::kLeaseMs;
  int64_t heartbeat_ms = defaults::kHeartbeatMs;
  // Prompts pending or in flight, all sets together; a submit beyond is RESOURCE_EXHAUSTED.
  int64_t max_pending_prompts = defaults::kMaxPendingPrompts;
  int32_t max_samples_per_prompt = defaults::kMaxSamplesPerPrompt;
  int64_t max_prompts_per_set =
      defaults::kMaxPromptsPerSet;  // one submission's prompts; more: RESOURCE_EXHAUSTED
  // RewardService addresses a prompt set's "remote" reward may name; any other is refused.
  std::vector<std::string> reward_addresses;
  // EnvironmentService addresses a prompt set's environment may name (built-in ones need
  // none); any other is refused.
  std::vector<std::string> env_addresses;
  // The longest EnvironmentSpec.timeout_s a submission may give (its default: 30 or this).
  double max_env_timeout_s = 120;
  // AgentService addresses a prompt set's agent may name (docs/agents.md); any other is refused.
  std::vector<std::string> agent_addresses;
  // The longest AgentSpec.timeout_s (an episode's wall time) a submission may give (its
  // default: 300 or this).
  double max_agent_timeout_s = 600;
  // Evaluation sets' leases an actor may hold (coordinator/eval_rounds.h): this share of its
  // prompt slots (ActorCapacity.max_prompts_in_flight), at least 1; 1 when it declared none.
  double eval_max_actor_share = 0.25;
  int64_t max_lag = defaults::kMaxLag;
  int64_t groups_per_step = 0;  // 0: no max_lag budget
  // Failed attempts (release, lease expiry, dropped from a heartbeat) after which a prompt is
  // failed instead of re-queued: a prompt no actor can finish is never retried forever.
  int32_t max_attempts = defaults::kMaxAttempts;
  // Hand-backs by the learner (ReopenPrompts: its group came in too stale) after which a
  // prompt is failed: one whose rollouts always outlast learner.max_lag steps is not re-run
  // forever. Counted apart from max_attempts: staleness is the pipeline's doing.
  int32_t max_stale_reruns = defaults::kMaxStaleReruns;
  // Sync mode: the conventional loop on the same processes. At most groups_per_step prompts
  // are leased or waiting for the learner at a time (a budget of max_lag 0), and leases
  // require the learner's newest version (LeaseResponse.min_weight_version), so a step's
  // batch is generated entirely with the weights of the step before.
  bool sync = false;
  // The model's limits, for validating submissions.
  int64_t vocab_size = 0;
  int64_t max_position_embeddings = 0;
  // The model's text (tokenizer/text_codec.h): encodes text and chat prompts and gives the
  // stop ids filled in when a submission names none; null: text and chat prompts are refused.
  std::shared_ptr<const tokenizer::TextCodec> text;
  // Completion texts kept per prompt set for watchers (GroupResult.texts); beyond this, the
  // oldest groups' texts are dropped (and marked so).
  int64_t max_text_bytes_per_set = int64_t{16} << 20;
  // Checks a reward spec (known name, parameters); null: every name is refused.
  std::function<absl::Status(const prl::v1::RewardSpec&)> validate_reward;
  // Tests: runs before every fsync of the prompt log (PromptLogOptions::before_sync).
  std::function<void()> log_before_sync;
  // Registered actors at most: the table is bounded whoever holds the actor token. An actor
  // not heard from (heartbeat, lease, completion) for 2 lease_ms that holds no lease is
  // forgotten (ExpireLeases, and a registration at the cap); a registration beyond the cap
  // is RESOURCE_EXHAUSTED. A forgotten actor that comes back is told to register again.
  int64_t max_actors = defaults::kMaxActors;

  // ---- Bounded, durable state (coordinator/coordinator_snapshot.cc) ----
  // Concurrent completions share the log's fsyncs (group commit); false: one fsync per
  // append, under the coordinator's mutex (the baseline of `prl bench coordinator`).
  bool group_commit = true;
  // The log is rewritten as a snapshot of the live state once it is larger than this and
  // than twice its last snapshot, so that its size stays within a constant factor of the live
  // state (each compaction stalls the coordinator for one snapshot write).
  int64_t compact_log_bytes = defaults::kCompactLogMb << 20;
  // A set done or cancelled longer ago than this is dropped from memory and from the next
  // snapshot, with its idempotency key (a later submit with that key is a new set). Measured
  // from the record that finished it. 0: finished sets are kept forever.
  int64_t retention_s = defaults::kRetentionS;
  // ---- end ----

  // ---- Tenants: adapters on a shared base (coordinator/adapters.h, coordinator/tenants.h) ----
  // A run of adapters: every set names the LoRA adapter it trains (created by the first set
  // that names it), each adapter with its own lag budget; false: sets train the run's model
  // and naming an adapter is refused.
  bool adapters = false;
  // A new adapter's unset settings (the run's learner.lora_rank, lora_alpha, lora_rslora,
  // lora_targets, lr).
  prl::v1::AdapterSpec adapter_defaults;
  int64_t max_adapters = 64;  // live adapters, all tenants together
  // The learner's ranks (learner.world_size): each new adapter is placed on the rank with the
  // fewest live adapters (AdapterStatus.learner_rank), for its life.
  int32_t learner_ranks = 1;
  int32_t max_adapter_rank = 256;
  // The model's check of a resolved adapter (its targets exist, the rank fits every target);
  // null: the coordinator's own checks only.
  std::function<absl::Status(const prl::v1::AdapterSpec&)> validate_adapter;
  // Tenants by name (the names of security.tenant_token_files): what each may do. A caller
  // whose tenant is not listed may do nothing.
  std::map<std::string, TenantLimits> tenants;
  // ---- end ----
};

struct CoordinatorStats {
  int64_t prompt_sets = 0;
  int64_t prompts_pending = 0, prompts_in_flight = 0, prompts_done = 0;
  int64_t groups_completed = 0, leases_expired = 0, duplicate_completions = 0;
  int64_t leases_dropped = 0;    // re-queued because the holder's heartbeat no longer listed them
  int64_t leases_released = 0;   // given back by their holder (Release)
  int64_t leases_reclaimed = 0;  // given back on request for a fair share (not failed attempts)
  int64_t prompts_failed = 0;    // given up on after max_attempts failed attempts
  int64_t prompts_reopened = 0;  // completed prompts the learner handed back (too stale)
  // Refused requests: completions of leases the actor does not hold, out-of-bounds progress,
  // groups pushed for prompts not leased to the pushing actor.
  int64_t rejected_completions = 0, rejected_progress = 0, rejected_groups = 0;
  int64_t rejected_releases = 0;  // releases of leases the actor does not hold
  int64_t learner_version = 0, groups_consumed = 0;
  int64_t groups_unconsumed = 0;  // the budget's estimate of groups not yet trained on
  int64_t actors = 0;
  int64_t torn_log_bytes = 0;                     // cut off the log's end at open
  int64_t log_compactions = 0, sets_retired = 0;  // since open
  // Lease calls that the staleness budget granted fewer prompts than asked while prompts were
  // pending, and the prompts leased to each actor (by the name it registered with).
  int64_t lease_requests_throttled = 0;
  std::map<std::string, int64_t> prompts_leased;
  // Leases and completed groups by prompt set name (coordinator/set_throughput.h).
  std::map<std::string, SetThroughput::Counts> set_throughput;
  // Evaluation sets (coordinator/eval_rounds.h), by name: the newest finished round, and the
  // finished rounds the coordinator holds (sets of one name add up).
  struct EvalSeries {
    prl::v1::EvalRoundResult latest;
    int64_t rounds = 0;
  };
  std::map<std::string, EvalSeries> evals;  // the first kMaxEvalNames names
  static constexpr size_t kMaxEvalNames = 100;
  // Adapters (a run of tenants), by name: the learner's newest version of each, its groups
  // trained on and not yet, its prompts in flight and running sets.
  struct AdapterCounts {
    int64_t version = 0, groups_consumed = 0, groups_unconsumed = 0;
    int64_t prompts_in_flight = 0, prompt_sets_running = 0;
  };
  std::map<std::string, AdapterCounts> adapters;
  // Tenants (a run of adapters), by tenant name ("_operator": sets submitted without a tenant's
  // token): prompts leased now, training groups and their samples completed (counted since the
  // coordinator started, its log replayed), and groups its adapters' learners trained on.
  struct TenantCounts {
    int64_t prompts_in_flight = 0, groups_completed = 0, samples_completed = 0;
    int64_t groups_trained = 0;
  };
  std::map<std::string, TenantCounts> tenants;
  int64_t eval_groups = 0;  // groups of evaluation sets completed (never trained on)
};

class Coordinator {
 public:
  static absl::StatusOr<std::unique_ptr<Coordinator>> Open(const CoordinatorConfig& config);

  // PromptService. Submit validates everything first (errors name the field and prompt), then
  // makes the set durable. `caller`: the operator (default) or a tenant (coordinator/
  // tenants.h), who sees, watches and cancels its own sets only.
  absl::StatusOr<prl::v1::SubmitPromptSetResponse> Submit(
      const prl::v1::SubmitPromptSetRequest& request, const Caller& caller = {});
  absl::StatusOr<prl::v1::PromptSetStatus> Get(const std::string& prompt_set_id,
                                               const Caller& caller = {});
  std::vector<prl::v1::PromptSetStatus> List(const Caller& caller = {});
  // One page of List (ListPromptSets): page_size 0 means 100, at most 1000; a token that is
  // not one this coordinator returned is InvalidArgument.
  absl::StatusOr<prl::v1::ListPromptSetsResponse> ListPage(
      const prl::v1::ListPromptSetsRequest& request, const Caller& caller = {});
  // The adapters (a run of tenants), in creation order; a tenant's own only
  // (coordinator/tenancy.cc).
  prl::v1::ListAdaptersResponse ListAdapters(const Caller& caller = {});
  // Cancels the adapter's running sets and drops it, durably (DeleteAdapterRequest). Another
  // tenant's adapter is NotFound.
  absl::StatusOr<prl::v1::DeleteAdapterResponse> DeleteAdapter(const std::string& name,
                                                               const Caller& caller = {});
  // ActorControl.CheckGroup: OK iff the prompt is leased now under the group's lease.
  absl::Status CheckGroup(const prl::v1::CheckGroupRequest& request);
  absl::StatusOr<prl::v1::PromptSetStatus> Cancel(const std::string& prompt_set_id,
                                                  const Caller& caller = {});
  // Events of a set from `*cursor` on (the status first); waits up to timeout for one.
  // `finished` becomes true once the set is done or cancelled and every event was returned.
  // Groups carry their samples' texts only with `include_texts`.
  absl::StatusOr<std::vector<prl::v1::PromptSetEvent>> WatchEvents(
      const std::string& prompt_set_id, size_t* cursor, absl::Duration timeout, bool* finished,
      bool include_texts = false, const Caller& caller = {});

  // ActorControl.
  // The actor is leased only prompts within `capacity` (coordinator/capacity.h).
  // RESOURCE_EXHAUSTED at max_actors live actors.
  absl::StatusOr<prl::v1::RegisterResponse> RegisterActor(
      const std::string& name, const prl::v1::ActorCapacity& capacity = {});
  // Renews the leases the request lists and re-queues the actor's others.
  absl::StatusOr<prl::v1::HeartbeatResponse> Heartbeat(const prl::v1::HeartbeatRequest& request);
  absl::StatusOr<prl::v1::LeaseResponse> Lease(const prl::v1::LeaseRequest& request);
  // Records a completed group; returns once it is durable (group commit, prompt_log.h).
  absl::StatusOr<prl::v1::CompleteResponse> Complete(const prl::v1::CompleteRequest& request);
  // The same, returning at once: `done` gets the reply once the group is durable (or the
  // refusal), on this thread or the prompt log's flusher thread. `done` must be quick (a gRPC
  // callback server finishes its call there) and must not call into this coordinator.
  using CompleteDone = absl::AnyInvocable<void(absl::StatusOr<prl::v1::CompleteResponse>)>;
  void CompleteAsync(const prl::v1::CompleteRequest& request, CompleteDone done);
  // Gives a lease back at once: a failed attempt of its prompt (prompt_attempts.cc). Only the
  // holder with its lease id; FailedPrecondition otherwise, counted, nothing changes.
  absl::StatusOr<prl::v1::ReleaseResponse> Release(const prl::v1::ReleaseRequest& request);
  // The learner's progress and backlog (the budget's basis). Accepted only within bounds
  // (counts >= 0; a version at most kMaxVersionStep above the last one reported to this
  // coordinator); else FailedPrecondition, counted, nothing changes.
  // `seen`: the reply to the learner's previous report (LearnerProgressRequest.seen), if any.
  absl::StatusOr<prl::v1::LearnerProgressResponse> LearnerProgress(
      int64_t version, int64_t groups_consumed, int64_t groups_waiting = 0,
      const prl::v1::LearnerProgressResponse* seen = nullptr);
  // The same with a learner of adapters' per-adapter progress (LearnerProgressRequest.adapters):
  // each adapter's budget takes its part; the reply lists every live adapter's completions.
  absl::StatusOr<prl::v1::LearnerProgressResponse> LearnerProgress(
      const prl::v1::LearnerProgressRequest& request);
  static constexpr int64_t kMaxVersionStep = LagBudget::kMaxVersionStep;

  // Prompts the learner will not train on (too stale): each completed or leased one is pending
  // again as a stale re-run with the given reason (failed after max_stale_reruns; a leased
  // one's late Complete is refused), durably; others (pending, failed, of cancelled or unknown
  // sets) are left as they are.
  absl::StatusOr<prl::v1::ReopenPromptsResponse> Reopen(
      const prl::v1::ReopenPromptsRequest& request);

  // The prompt log's counters (appends, fsyncs, compactions, size); coordinator_snapshot.cc.
  PromptLogStats LogStats() const { return log_->stats(); }

  // Re-queues expired leases (also done on every Lease call) and waits for their records to be
  // durable without holding the mutex.
  void ExpireLeases();
  CoordinatorStats Stats();

 private:
  using PromptState = PromptSets::PromptState;
  explicit Coordinator(const CoordinatorConfig& config);
  // Submission checks (coordinator/submission.cc).
  absl::Status Validate(const prl::v1::SubmitPromptSetRequest& request, const Caller& caller,
                        prl::v1::SubmitPromptSetRequest* tokenised) const;
  absl::Status ValidateShape(const prl::v1::SubmitPromptSetRequest& request) const;
  absl::Status ValidateSampling(const prl::v1::SubmitPromptSetRequest& request) const;
  absl::Status ValidateReward(const prl::v1::RewardSpec& reward) const;
  // The agent of a set of agents' episodes, with its defaults filled into *out.
  absl::Status ValidateAgent(const prl::v1::SubmitPromptSetRequest& request, const Caller& caller,
                             prl::v1::AgentSpec* out) const;
  // The environment of a set of agentic episodes, with its defaults filled into *out.
  absl::Status ValidateEnvironment(const prl::v1::SubmitPromptSetRequest& request,
                                   const Caller& caller, prl::v1::EnvironmentSpec* out) const;
  // Whether actors may dial `address` for `caller`: one of `shared` (the operator's list,
  // `key` names it), or of the caller's own tenant addresses (`own`; the operator may use any
  // tenant's). Invalid naming `field` and the lists the caller may use otherwise.
  absl::Status CheckAddress(const Caller& caller, const std::string& address,
                            const std::vector<std::string>& shared, const char* key,
                            std::vector<std::string> TenantLimits::*own,
                            const std::string& field) const;
  // A logged record's effect on the prompt sets and the leases (replay and live), mutex held.
  void Apply(const prl::v1::LogRecord& record);

  // ---- Tenants and adapters (coordinator/tenancy.cc) ----
  // A submission's adapter checked and its defaults filled in (no mutex: its settings alone).
  absl::Status ValidateAdapter(const prl::v1::SubmitPromptSetRequest& request,
                               prl::v1::AdapterSpec* resolved) const;
  // Mutex held: the caller's quotas, and the set's adapter found or made (its tenant and
  // adapter id set in *submitted, whose request holds the resolved adapter; `asked`: the
  // adapter as submitted). Returns the AdapterCreated record to log first, if new.
  absl::StatusOr<std::optional<prl::v1::LogRecord>> AdmitLocked(
      const Caller& caller, const prl::v1::AdapterSpec& asked,
      prl::v1::SubmittedPromptSet* submitted) const;
  // The set, if the caller may see it; else null (NotFound for the caller).
  const PromptSets::Set* VisibleSetLocked(const std::string& id, const Caller& caller) const;
  // The adapter of a training set (its budget), or null.
  Adapters::Adapter* BudgetAdapterLocked(const PromptSets::Set& set);
  // Prompts of the adapter's training sets leased now.
  int64_t AdapterInFlightLocked(const Adapters::Adapter& adapter) const;
  // The adapters' part of a learner's report into *response.
  absl::Status AdapterProgressLocked(const prl::v1::LearnerProgressRequest& request,
                                     prl::v1::LearnerProgressResponse* response);
  // ---- end ----

  // ---- Lease lifecycle (coordinator/prompt_attempts.cc), mutex held ----
  // Ends the prompt's lease as a failed attempt: logged (not waited for) and applied; the
  // prompt is re-queued, or failed after max_attempts. Returns the record's log ticket.
  absl::StatusOr<uint64_t> FailAttemptLocked(const PromptRef& prompt, const std::string& reason);
  // The learner handed the prompt back (ReopenPrompts): as FailAttemptLocked, but counted as a
  // stale re-run (failed after max_stale_reruns), and a completed prompt is un-completed first.
  absl::StatusOr<uint64_t> HandBackLocked(const PromptRef& prompt, const std::string& reason);
  // Logs (not waited for) and applies a FailedAttempt record. Returns its log ticket.
  absl::StatusOr<uint64_t> LogAttemptLocked(const prl::v1::LogRecord& record);
  // Waits (mutex not held: an fsync must not stall other calls) until a failed attempt's
  // record is durable; a log error is printed and returned (the log then refuses every
  // append: Submit and Complete report it).
  absl::Status AwaitLogged(const absl::StatusOr<uint64_t>& ticket);
  // Complete up to the log write: the reply, and the log ticket to wait for before sending it
  // (0: nothing to wait for).
  struct LoggedCompletion {
    prl::v1::CompleteResponse response;
    uint64_t ticket = 0;
  };
  absl::StatusOr<LoggedCompletion> LogCompletion(const prl::v1::CompleteRequest& request);
  // Why the set's pending prompts wait: no live actor can run them (capacity.h); else "".
  std::string WaitNote(const PromptSets::Set& set) const;
  std::string ActorName(const std::string& actor_id) const;
  // ---- end ----

  // ---- Actors and leases (coordinator/leasing.cc), mutex held ----
  // Ends (or fails) leases past their deadline as failed attempts, logged without waiting.
  // Returns the last record's log ticket (0: none).
  absl::StatusOr<uint64_t> ExpireLocked(absl::Time now);
  // Forgets actors not heard from for 2 lease_ms that hold no lease.
  void ForgetDeadActorsLocked(absl::Time now);
  // How the actor's slots are shared between the classes of prompt sets (fair_share.h): its
  // leases by class, and the classes with pending prompts it can run.
  FairShare FairShareLocked(const std::string& actor_id, const ActorTable::Actor& actor) const;
  // Ends the prompt's lease as given back on request (RELEASE_REASON_RECLAIMED): re-queued at
  // the front, no attempt counted. Returns the record's log ticket.
  absl::StatusOr<uint64_t> ReclaimLocked(const PromptRef& prompt, const std::string& reason);
  // ---- end ----

  // ---- Evaluation sets (coordinator/evaluation.cc), mutex held ----
  // Logs (not waited for) and applies an EvalRound record: the set's next round opens at the
  // learner's version. Returns the record's log ticket.
  absl::StatusOr<uint64_t> OpenEvalRoundLocked(const std::string& set_id);
  // Opens the rounds due at the learner's version.
  void OpenDueEvalRoundsLocked();
  // The version an evaluation set's rounds follow: the learner's, or its adapter's.
  int64_t EvalVersionLocked(const std::string& set_id) const;
  // The evaluation sets' newest rounds by name (CoordinatorStats::evals).
  std::map<std::string, CoordinatorStats::EvalSeries> EvalSeriesLocked() const;
  // Evaluation leases the actor may take now: its share (eval_max_actor_share of its prompt
  // slots, at least 1) less those it holds.
  int64_t EvalLeasesAllowedLocked(const std::string& actor_id,
                                  const ActorTable::Actor& actor) const;
  // ---- end ----

  // ---- Bounded, durable state (coordinator/coordinator_snapshot.cc), mutex held ----
  // Compacts the log into the sets' snapshot when compact_log_bytes says so.
  void CompactIfDueLocked();
  // Retires the sets finished more than retention_s before `now`, with their leases.
  void RetireFinishedLocked(absl::Time now);
  int64_t compact_retry_bytes_ = 0;  // after a failed compaction: retry above
  // ---- end ----

  // The coordinator owns the mutex, the log and the rule "log first, then apply"; each part
  // owns its state and is called under the mutex.
  CoordinatorConfig config_;
  std::unique_ptr<PromptLog> log_;
  std::mutex mu_;
  std::condition_variable changed_;  // a record was applied, or sets were retired
  PromptSets sets_;                  // sets, prompts, keys, events (prompt_sets.h)
  LeaseScheduler scheduler_;         // pending prompts in lease order (lease_scheduler.h)
  LeaseTable leases_;                // open leases and their deadlines (lease_table.h)
  ActorTable actors_;                // registered actors (actor_table.h)
  // The max_lag budget and the learner's progress (lag_budget.h), from the count of
  // completions after the log's replay.
  std::optional<LagBudget> budget_;
  Adapters adapters_;         // a run of tenants' adapters and their budgets (adapters.h)
  // Training groups and samples completed per tenant ("_operator": no tenant), a run of adapters.
  std::map<std::string, std::pair<int64_t, int64_t>> tenant_completed_;
  CoordinatorStats stats_;    // the calls' counters; the rest is derived in Stats()
  SetThroughput throughput_;  // leases and completed groups by set name (set_throughput.h)
};

}  // namespace prl::coordinator
