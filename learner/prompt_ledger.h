// PromptLedger: the prompts whose groups this learner's lineage has trained on, in training
// order — what makes training exactly-once per prompt (docs/learner.md, "Exactly once").
//
// A prompt can produce more than one group: an actor killed after writing its group but before
// the coordinator recorded the completion has its prompt re-run, and a replay push retried
// after a lost reply can land twice. The learner trains the first group of a prompt that
// reaches a step and acknowledges later ones without training them. The ledger is durable with
// the lineage: each journaled step carries its prompts' keys (learner/step_journal.h) and each
// checkpoint directory holds the whole ledger up to its step (kFileName), so a resumed learner
// knows every prompt its checkpoint and journal trained.
//
// A key is "<prompt_set_id>\t<prompt_index>"; groups without a prompt set id (offline rollouts)
// have none and are never deduplicated. File: one line per trained group, "<step>\t<key>".
// The keys of a prompt set the coordinator retired are forgotten (ForgetSet): the ledger holds
// the live sets' prompts only.
//
// Thread-safety: rank 0 of the learner only; not for concurrent use.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"

namespace prl::learner {

class PromptLedger {
 public:
  static constexpr const char* kFileName = "trained_prompts.tsv";

  // The key of a prompt; empty when the group has no prompt set id (or an id with a tab or
  // a line break, which a coordinator never issues).
  static std::string Key(const std::string& prompt_set_id, uint64_t prompt_index);

  bool Contains(const std::string& key) const { return keys_.contains(key); }
  // Records that `step` trained a group of `key`'s prompt (empty keys are ignored).
  void Add(int64_t step, const std::string& key);
  int64_t size() const { return static_cast<int64_t>(order_.size()); }
  // Forgets the keys of `prompt_set_id` (the coordinator retired the set: none of its prompts
  // can be leased again), so that the ledger is bounded by the live sets. A late group of a
  // forgotten set is far older than learner.max_lag and goes back as stale, untrained.
  // Returns how many keys were forgotten.
  int64_t ForgetSet(const std::string& prompt_set_id);

  // Written atomically (fsync'd, renamed); read back by Read. A missing file is an empty
  // ledger; a malformed line is DataLoss naming the file and line.
  absl::Status Write(const std::string& path) const;
  static absl::StatusOr<PromptLedger> Read(const std::string& path);

 private:
  std::vector<std::pair<int64_t, std::string>> order_;  // (step, key) in training order
  absl::flat_hash_set<std::string> keys_;
};

}  // namespace prl::learner
