// StepJournal: the data of every optimizer step since the last checkpoint, on the checkpoint
// volume, so that a learner killed between checkpoints continues bit-identically to one that
// was never killed (docs/learner.md, "Durable training").
//
// Rank 0 appends a step's samples (exactly the bytes every rank trains on) before the step
// trains, durably (written to a temporary file, fsync'd, renamed, directory fsync'd), and only
// then acknowledges the step's groups to the replay buffer: a group leaves the buffer only once
// it is on disk. When a checkpoint covering a step is durable, the journal drops it. A learner
// that resumes from checkpoint step c replays the journal's steps c+1.. in order before it
// takes anything new, so its data order, and hence its weights, are those of the learner that
// died. Files: <dir>/step-<12 digits>.bin; each holds a fixed header (magic, step, the report's
// group/sample counts and mean reward, key count, prompt-key bytes, payload length, XXH3 of the
// rest), the group keys, the prompt keys (learner/prompt_ledger.h; one per line) and the
// payload.
//
// Thread-safety: one writer (rank 0); not for concurrent use.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace prl::learner {

struct JournaledStep {
  int64_t step = 0;
  int64_t groups = 0, samples = 0;  // as the step's report counted them
  double mean_reward = 0;
  // The replay keys of the step's groups: a learner killed after journaling a step but before
  // acknowledging its groups gets them again, and must skip them.
  std::vector<uint64_t> group_keys;
  // The prompts of the step's groups (PromptLedger keys; empty ones omitted): part of the
  // lineage's ledger once the step is journaled.
  std::vector<std::string> prompt_keys;
  std::vector<uint8_t> payload;  // the step's samples as rank 0 broadcasts them
};

class StepJournal {
 public:
  // Opens (creating) the journal directory.
  static absl::StatusOr<StepJournal> Open(const std::string& dir);

  // Durable when it returns OK.
  absl::Status Append(const JournaledStep& step) const;
  // The journaled steps after `step`, which must be step+1, step+2, ... without a gap (a gap or
  // a damaged file is DataLoss naming the file); steps at or before `step` are removed.
  absl::StatusOr<std::vector<JournaledStep>> StepsAfter(int64_t step) const;
  // Removes the steps at or before `step` (a checkpoint covering them is durable).
  absl::Status DropThrough(int64_t step) const;

  const std::string& dir() const { return dir_; }

 private:
  explicit StepJournal(std::string dir) : dir_(std::move(dir)) {}
  std::string PathOf(int64_t step) const;
  absl::StatusOr<JournaledStep> Read(const std::string& path) const;
  absl::StatusOr<std::vector<int64_t>> Steps() const;

  std::string dir_;
};

}  // namespace prl::learner
