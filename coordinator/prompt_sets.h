// PromptSets: the coordinator's prompt sets — each prompt's state and attempt counts, the
// sets' idempotency keys, their events and completion texts for watchers, and retention of
// finished sets. Which pending prompt is leased next is the lease scheduler's
// (coordinator/lease_scheduler.h), which the coordinator tells of the prompts these records
// make pending.
//
// Every change comes from a prompt log record (coordinator/prompt_log.h) that the coordinator
// has already written: Submitted, Completed, Cancelled, FailedAttempt — the same calls replay
// the log at open, so what is in memory is always what the log says — plus the one change
// that is not durable, a pending prompt leased (MarkLeased; leases themselves are the lease
// table's, coordinator/lease_table.h). Failed attempts: a FailedAttempt record carries the
// prompt's counts (attempts, stale re-runs) and whether it failed; a leased prompt it names is
// pending again (to be re-run first), a completed one it reopens is un-completed.
//
// Evaluation sets (SubmitPromptSetRequest.eval; their rounds are EvalRounds', coordinator/
// eval_rounds.h, which this owns): never done while running; an EvalRound record reopens every
// prompt for a new round; their groups count apart from the training groups (Counts).
//
// Bounds: a set's completion texts stay within max_text_bytes_per_set (the oldest groups'
// are dropped and marked so); a set done or cancelled retention_s ago is retired (Retire:
// dropped with its idempotency key, remembered by id for the learner's
// ledger); Snapshot gives the live state as the few log records that rebuild it, for the
// log's compaction (prompt_sets_snapshot.cc).
//
// Not thread-safe: the coordinator calls it under its mutex.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "coordinator/eval_rounds.h"
#include "prl/v1/prompt.pb.h"

namespace prl::coordinator {

class PromptSets {
 public:
  enum class PromptState { kPending, kLeased, kDone, kFailed };
  struct Prompt {
    PromptState state = PromptState::kPending;
    int32_t attempts = 0;      // failed attempts so far (< max_attempts unless kFailed)
    int32_t stale_reruns = 0;  // hand-backs so far (< max_stale_reruns unless kFailed)
    std::string last_reason;   // of the last failed attempt
  };
  struct Set {
    prl::v1::SubmittedPromptSet submitted;  // prompts as token ids
    prl::v1::PromptSetState state = prl::v1::PROMPT_SET_STATE_RUNNING;
    std::vector<Prompt> prompts;
    int64_t pending = 0, in_flight = 0, done = 0, failed = 0;
    int32_t samples = 0;     // per prompt
    int64_t max_tokens = 0;  // the longest prompt's tokens + sampling.max_tokens
    int64_t min_tokens = 0;  // the shortest prompt's tokens + sampling.max_tokens
    double weight = 1;       // its share of leases (request.weight; unset: 1)
    std::vector<prl::v1::FailedPrompt> first_failed;  // at most kMaxFailedListed
    double reward_sum = 0;
    int64_t reward_count = 0;
    std::vector<prl::v1::PromptSetEvent> events;  // groups, each followed by a status
    int64_t text_bytes = 0;                       // of the texts the events hold
    size_t oldest_text = 0;                       // events before this hold no texts
    // An evaluation set: the index of the first event of the running (or last) round.
    size_t round_first_event = 0;
    bool eval() const { return submitted.request().eval().every_versions() > 0; }
    const std::string& id() const { return submitted.prompt_set_id(); }
    bool running() const { return state == prl::v1::PROMPT_SET_STATE_RUNNING; }
  };
  // What the sets have counted since open (replayed records included).
  struct Counts {
    // groups_completed: of training sets (the lag budget's); eval_groups: of evaluation sets.
    int64_t groups_completed = 0, prompts_failed = 0, prompts_reopened = 0, sets_retired = 0;
    int64_t eval_groups = 0;
  };
  // Why a running set's pending prompts wait (no live actor can run them), or "": the
  // coordinator's, which knows the actors (coordinator/capacity.h).
  using WaitNote = std::function<std::string(const Set&)>;
  static constexpr size_t kMaxFailedListed = 100;  // PromptSetStatus.failed_prompts
  static constexpr size_t kRecentlyRetired = 4096;  // set ids remembered after retirement

  PromptSets(int64_t max_text_bytes_per_set, WaitNote wait_note)
      : max_text_bytes_per_set_(max_text_bytes_per_set), wait_note_(std::move(wait_note)) {}

  // ---- Records (live and replayed) ----
  void ApplySubmitted(const prl::v1::SubmittedPromptSet& submitted);
  // The prompt is done with this group, unless it is done or failed already. The group keeps
  // its texts (for watchers) within the set's bound.
  void ApplyCompleted(const std::string& set_id, const prl::v1::GroupResult& result);
  void ApplyCancelled(const std::string& set_id);
  // Returns whether the prompt is pending again (leased, or completed and reopened): a re-run.
  bool ApplyFailedAttempt(const prl::v1::FailedAttempt& attempt);
  // An evaluation set's round opens (every prompt pending again, its counts from zero; returns
  // the prompts made pending, for the scheduler) or, from a snapshot, a finished round is
  // restored into its history (returns none).
  std::vector<int64_t> ApplyEvalRound(const prl::v1::EvalRound& round);
  // A pending prompt of a running set is leased (not durable: a restart makes it pending).
  void MarkLeased(const std::string& set_id, int64_t index);
  // What a lease of the set's prompt carries (LeasedPrompt, less its lease id): its tokens,
  // reference, group size, sampling and reward, and an episode's environment or agent with the
  // prompt as submitted.
  static void FillLease(const Set& set, int64_t index, prl::v1::LeasedPrompt* out);

  // ---- Reading ----
  const Set* Find(const std::string& set_id) const;
  // The prompt, or null when the set is unknown or the index out of range.
  const Prompt* FindPrompt(const std::string& set_id, int64_t index) const;
  // The set the tenant (empty: the operator) submitted with this idempotency key (and not
  // retired), or null: keys are per tenant.
  const std::string* ByIdempotencyKey(const std::string& tenant, const std::string& key) const;
  // Set ids in submission order.
  const std::vector<std::string>& order() const { return order_; }
  // `with_eval_rounds`: an evaluation set's finished rounds (up to EvalRounds::kMaxHistory);
  // the statuses stored in a set's events leave them out (one per completed group: a copy of
  // the history in each would grow a set's memory with the square of its rounds).
  prl::v1::PromptSetStatus StatusOf(const Set& set, bool with_eval_rounds = true) const;
  // Prompts pending or in flight in running sets.
  int64_t PendingOrInFlight() const;
  int64_t size() const { return static_cast<int64_t>(sets_.size()); }
  const Counts& counts() const { return counts_; }
  // Prompts of evaluation sets leased now (outside the lag budget).
  int64_t EvalInFlight() const;
  // The running evaluation sets whose next round is due, each at its version (the learner's,
  // or its adapter's).
  std::vector<std::string> DueEvalRounds(
      const std::function<int64_t(const std::string& set_id)>& version_of) const;
  const EvalRounds& eval_rounds() const { return eval_; }
  // Pending (running sets only), in flight and done prompts of all sets.
  void Totals(int64_t* pending, int64_t* in_flight, int64_t* done) const;

  // ---- Retention and compaction (prompt_sets_snapshot.cc) ----
  // Retires the sets done or cancelled at least retention_s before `now` (their finishing
  // time is first seen here, or recovered from the log); returns their ids. 0: none ever.
  std::vector<std::string> Retire(absl::Time now, int64_t retention_s);
  // The finishing times of the sets the replayed log finished: its records' stamps.
  void RecoverFinishTimes(const std::vector<prl::v1::LogRecord>& records);
  // The newest retired set ids (at most kRecentlyRetired), oldest first.
  const std::deque<std::string>& recently_retired() const { return recently_retired_; }
  // The live state as log records (submissions, completions, attempts, cancellations, in set
  // order): replaying them rebuilds these sets. Whoever adds durable state extends it.
  std::vector<prl::v1::LogRecord> Snapshot() const;

 private:
  Set* FindMutable(const std::string& set_id);
  static std::string ScopedKey(const std::string& tenant, const std::string& key);
  void Requeue(Set& set, int64_t index);  // a leased prompt is pending again
  void FinishIfSettled(Set& set);         // done once every prompt is completed or failed
  void BoundTexts(Set& set);              // the newest group's texts counted, oldest dropped
  // Snapshot's records of an evaluation set's rounds (prompt_sets_snapshot.cc).
  void AppendEvalRounds(const std::string& id, const Set& set,
                        std::vector<prl::v1::LogRecord>* out) const;

  int64_t max_text_bytes_per_set_;
  WaitNote wait_note_;
  std::map<std::string, Set> sets_;
  std::vector<std::string> order_;                   // set ids in submission order
  std::map<std::string, std::string> idempotency_;   // key -> set id
  std::map<std::string, absl::Time> finished_at_;    // finished sets: since when
  std::deque<std::string> recently_retired_;
  Counts counts_;
  EvalRounds eval_;  // the evaluation sets' rounds
};

}  // namespace prl::coordinator
