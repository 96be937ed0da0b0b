// GroupAdmission: rank 0's decision about each group the learner takes from the replay buffer
// — trained, acknowledged without training, or held until the coordinator takes its prompt
// back — and the record of which prompts the lineage trained (learner/learner_service.h,
// "Exactly once").
//
// In order, a taken group is:
//   - skipped (acknowledged) when a journaled step the learner is replaying already holds it
//     (a predecessor trained it and died before acknowledging);
//   - dead-lettered when it fails the check against the model (replay/quarantine.h): its
//     prompt is handed back ("quarantined: ..."), or, with no coordinator, it is acknowledged;
//   - acknowledged and counted as a duplicate when its prompt was trained by the lineage
//     (the ledger) or is already in the step being taken;
//   - older than max_lag: held for the coordinator (learner/prompt_hand_back.h) with a reason
//     naming the versions; one without a prompt is acknowledged and counted as dropped (with
//     no coordinator the replay buffer drops stale groups itself);
//   - else admitted: its prompt joins the step's, and the ledger once the step is committed.
//
// Owns: the quarantine, the prompt ledger, the step's prompt keys, the replayed group keys,
// the hand-back and the counters. Rank 0 only; not for concurrent use.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "learner/prompt_hand_back.h"
#include "learner/prompt_ledger.h"
#include "replay/quarantine.h"
#include "replay/replay_buffer.h"

namespace prl::learner {

struct AdmissionOptions {
  int64_t max_lag = 4;
  std::string dead_letter_path;       // empty: dead letters are counted only
  PromptHandBack::Reopen reopen;      // null: no coordinator to hand prompts back to
  absl::Duration reopen_retry = absl::Milliseconds(500);
};

class GroupAdmission {
 public:
  // `replay` (which must outlive this) acknowledges the groups not trained.
  GroupAdmission(const ModelLimits& limits, ReplayBuffer* replay, AdmissionOptions options);

  // The group's records when it is to be trained; nullopt when it was acknowledged or held.
  std::optional<std::vector<RolloutRecord>> Admit(const LeasedGroup& group,
                                                  int64_t learner_version);
  // Offers the held prompts to the coordinator (rate-limited) and acknowledges the groups it
  // took back.
  void Offer();
  // Whether stale groups come to Admit (there is a coordinator to hand them to) rather than
  // being dropped by the replay buffer.
  bool hands_back() const { return hand_back_.has_value(); }

  // The prompt keys admitted since the last call, handed over for the step that trains them.
  std::vector<std::string> TakeStepPrompts();
  // The step that trained `prompts` is durable (journaled) or done: they join the ledger.
  void Commit(int64_t step, const std::vector<std::string>& prompts);
  // Groups of journaled steps about to be replayed: skipped if the buffer delivers them again.
  void SkipReplayed(const std::vector<uint64_t>& group_keys);
  // The prompt sets the coordinator retired leave the ledger (which stays bounded).
  void ForgetSets(const std::vector<std::string>& set_ids);
  // The ledger, for the checkpoint (written with it) and for a resume (read from it).
  PromptLedger& ledger() { return ledger_; }

  // Counters since start: duplicates acknowledged, stale groups dropped without a prompt,
  // stale prompts taken back by the coordinator.
  int64_t duplicate_groups() const { return duplicate_groups_; }
  int64_t stale_dropped() const { return stale_dropped_; }
  int64_t stale_requeued() const { return hand_back_ ? hand_back_->stale_requeued() : 0; }
  QuarantineCounts dead_letters() const { return quarantine_.counts(); }
  const PromptLedger& ledger() const { return ledger_; }

 private:
  ReplayBuffer* replay_;
  int64_t max_lag_;
  Quarantine quarantine_;
  std::optional<PromptHandBack> hand_back_;
  PromptLedger ledger_;
  std::vector<std::string> step_prompts_;
  std::set<uint64_t> replayed_keys_;
  int64_t duplicate_groups_ = 0, stale_dropped_ = 0;
};

}  // namespace prl::learner
