#include "learner/group_admission.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "core/test_hooks.h"

namespace prl::learner {

GroupAdmission::GroupAdmission(const ModelLimits& limits, ReplayBuffer* replay,
                               AdmissionOptions options)
    : replay_(replay),
      max_lag_(options.max_lag),
      quarantine_(limits, options.dead_letter_path, "learner") {
  if (options.reopen) hand_back_.emplace(replay, std::move(options.reopen), options.reopen_retry);
}

namespace {

// The decision about each taken group, for crash tests' oracle (core/test_hooks.h).
void Tap(const char* decision, const LeasedGroup& group, const std::string& prompt) {
  TapLine("learner_admission", absl::StrCat(decision, "\t", group.group_key, "\t", prompt));
}

}  // namespace

std::optional<std::vector<RolloutRecord>> GroupAdmission::Admit(const LeasedGroup& group,
                                                                int64_t learner_version) {
  if (replayed_keys_.erase(group.group_key) > 0) {
    Tap("replayed", group, "");
    // Journaled and trained by the learner this one replaced, which died before its Ack.
    replay_->Ack(group).IgnoreError();
    return std::nullopt;
  }
  // Quarantine: a group the model cannot take is dead-lettered, never trained; its prompt is
  // handed back to be generated again (the coordinator counts the attempt and fails the
  // prompt visibly after its last), as a stale group's is.
  std::optional<Quarantine::RefusedPrompt> refused;
  std::optional<std::vector<RolloutRecord>> records =
      quarantine_.Admit(group, learner_version, &refused);
  if (!records.has_value()) {
    Tap("quarantined", group, refused.has_value() ? refused->prompt_set_id : "");
    if (refused.has_value() && hand_back_.has_value()) {
      hand_back_->Hold(group,
                       StalePrompt{refused->prompt_set_id, refused->prompt_index,
                                   absl::StrCat("quarantined: ", refused->problem)},
                       /*quarantined=*/true);
    } else {
      replay_->Ack(group).IgnoreError();  // a lost lease brings it back, to be refused again
    }
    return std::nullopt;
  }
  const RolloutRecord* first = records->empty() ? nullptr : &(*records)[0];
  const std::string key =
      first == nullptr ? "" : PromptLedger::Key(first->prompt_set_id, first->prompt_index);
  const bool in_step = !key.empty() && std::find(step_prompts_.begin(), step_prompts_.end(),
                                                 key) != step_prompts_.end();
  if (!key.empty() && (ledger_.Contains(key) || in_step)) {
    Tap(in_step ? "duplicate_in_step" : "duplicate", group, key);
    replay_->Ack(group).IgnoreError();  // a second group of a trained prompt: never trained
    ++duplicate_groups_;
    return std::nullopt;
  }
  const int64_t lag = learner_version - group.min_version;
  if (hand_back_.has_value() && lag > max_lag_) {
    Tap("stale", group, key);
    if (key.empty()) {  // no prompt to hand back: dropped, as the buffer would have
      replay_->Ack(group).IgnoreError();
      ++stale_dropped_;
      return std::nullopt;
    }
    hand_back_->Hold(
        group,
        StalePrompt{first->prompt_set_id, first->prompt_index,
                    absl::StrCat("stale: generated from weight version ", group.min_version, ", ",
                                 lag, " versions behind the learner's ", learner_version,
                                 " (learner.max_lag ", max_lag_, ")")},
        /*quarantined=*/false);
    return std::nullopt;
  }
  Tap("admitted", group, key);
  if (!key.empty()) step_prompts_.push_back(key);
  return records;
}

void GroupAdmission::Offer() {
  if (hand_back_.has_value()) hand_back_->Offer();
}

std::vector<std::string> GroupAdmission::TakeStepPrompts() {
  std::vector<std::string> prompts = std::move(step_prompts_);
  step_prompts_.clear();
  return prompts;
}

void GroupAdmission::Commit(int64_t step, const std::vector<std::string>& prompts) {
  for (const std::string& key : prompts) ledger_.Add(step, key);
}

void GroupAdmission::SkipReplayed(const std::vector<uint64_t>& group_keys) {
  replayed_keys_.insert(group_keys.begin(), group_keys.end());
}

void GroupAdmission::ForgetSets(const std::vector<std::string>& set_ids) {
  for (const std::string& id : set_ids) ledger_.ForgetSet(id);
}

}  // namespace prl::learner
