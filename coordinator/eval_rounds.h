// EvalRounds: the rounds of the evaluation sets (SubmitPromptSetRequest.eval; docs/operations.md,
// "Evaluation during training").
//
// An evaluation set is never trained on: its prompts run as a round when it is submitted (at
// the learner's version then) and again once the learner's version reaches the last round's
// version + every_versions (a round still running when the next is due finishes first; the
// next then opens at the version reached, so a slow evaluation skips versions rather than
// piling up). A round ends when each of its prompts is scored or failed; its result is the mean
// reward over the samples and pass@k, the share of scored prompts with a sample of reward >=
// pass_reward (k = samples_per_prompt).
//
// Owns: per evaluation set, its schedule, the running round's sums and the finished rounds
// (the newest kMaxHistory). The prompts themselves stay in PromptSets (coordinator/
// prompt_sets.h), which reopens them for each round. Not thread-safe: the coordinator calls it
// under its mutex, for live and replayed records alike.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "prl/v1/prompt.pb.h"

namespace prl::coordinator {

class EvalRounds {
 public:
  static constexpr size_t kMaxHistory = 1000;  // finished rounds kept per set
  static constexpr int64_t kNoRound = -1;

  struct Series {
    int64_t every_versions = 1;
    double pass_reward = 1.0;
    int32_t k = 1;
    int64_t round_version = kNoRound;  // the running round's, or kNoRound
    int64_t next_version = 0;          // a round is due once the learner reaches this
    // The running round's sums.
    int64_t prompts = 0, failed = 0, samples = 0, passed = 0;
    double reward_sum = 0;
    int64_t min_weight_version = 0, max_weight_version = 0;  // of the groups scored so far
    std::deque<prl::v1::EvalRoundResult> history;  // oldest first
  };

  // An evaluation set was submitted (no round runs until Open).
  void Add(const std::string& set_id, const prl::v1::EvalSpec& spec, int32_t samples_per_prompt);
  void Remove(const std::string& set_id);  // retired or cancelled
  bool Contains(const std::string& set_id) const { return series_.count(set_id) > 0; }
  const Series* Find(const std::string& set_id) const;

  // A round opens at `version` (EvalRound record): its sums start from zero.
  void Open(const std::string& set_id, int64_t version);
  // A finished round from a snapshot (EvalRound.finished), appended to the history.
  void Restore(const std::string& set_id, const prl::v1::EvalRoundResult& finished);
  // A group of the running round was scored, or one of its prompts failed. Nothing happens
  // when no round runs (a group of a round whose opening record was lost).
  void Scored(const std::string& set_id, const prl::v1::GroupResult& result);
  void Failed(const std::string& set_id);
  // The running round ended (every prompt scored or failed): its result, appended to the
  // history; the next round is due at its version + every_versions.
  prl::v1::EvalRoundResult Finish(const std::string& set_id, int64_t unix_ms);

  // The sets, in id order, whose next round is due at learner version `version` (no round
  // running, version >= next_version).
  std::vector<std::string> Due(int64_t version) const;
  // The same where each set's version is its own: an adapter's set follows its adapter's.
  std::vector<std::string> Due(const std::function<int64_t(const std::string&)>& version_of) const;

 private:
  std::map<std::string, Series> series_;
};

}  // namespace prl::coordinator
