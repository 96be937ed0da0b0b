// Quarantine: where rollout groups that fail the check against the model go
// (replay/group_validation.h). Each one is written as one line of a dead-letter file (JSONL)
// and counted by reason; the caller drops it: the learner acknowledges it out of the replay
// buffer and trains nothing from it, the replay ingest refuses it. So a bad group is seen once,
// recorded, and never crash-loops a learner.
//
// A line holds the time, the checker, the group's ids and size, and the problem; never the
// payload. Every string is capped at 256 bytes, so a line stays under 4 KiB however large the
// group:
//   {"unix_time":1718000000.25,"source":"learner","run_id":"r","prompt_set_id":"ps-1",
//    "prompt_index":3,"group_id":7,"actor_id":"a-0","records":4,"reason":"token_id",
//    "field":"records[1].completion_tokens[17]","expected":"a token id in [0, 32000)",
//    "found":"32001"}
// A group whose bytes do not decode has no ids: its line has "group_key" (hex) instead.
//
// The file (0600: run data) is opened on the first dead letter (appending; its directory
// created), and each line is written with one write(2) and fdatasync'd. The first dead letter
// of each reason is also printed on stderr, naming the file. A file that cannot be written does
// not stop the caller: the group is still dropped and counted, the error goes to stderr and is
// counted too (write_errors).
//
// Thread-safety: every method may be called from any thread.
#pragma once

#include <array>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "replay/group_validation.h"
#include "replay/replay_buffer.h"

namespace prl {

struct QuarantineCounts {
  std::array<int64_t, kNumDeadLetterReasons> by_reason{};  // indexed by DeadLetterReason
  int64_t write_errors = 0;                                // lines that could not be written
  int64_t total() const;
};

class Quarantine {
 public:
  // `path` empty: dead letters are counted only. `source` names the checker in each line
  // ("learner", "ingest").
  Quarantine(const ModelLimits& limits, std::string path, std::string source);
  ~Quarantine();
  Quarantine(const Quarantine&) = delete;
  Quarantine& operator=(const Quarantine&) = delete;

  // A dead-lettered group that decoded: its prompt, which the caller has generated again (a
  // refused group must not leave its prompt "done" and untrained), and the problem in words.
  struct RefusedPrompt {
    std::string prompt_set_id;
    uint64_t prompt_index = 0;
    std::string problem;  // "token_id: records[1].completion_tokens[2]: expected ..."
  };

  // The learner's side: decodes a leased group and checks it at `learner_version`. The records
  // when it passes; nullopt when it was dead-lettered (bytes that fail their checksum or do
  // not decode: reason "corrupt"), and the caller acknowledges it, training nothing from it.
  // `refused` (optional) receives the prompt of a dead-lettered group that decoded.
  std::optional<std::vector<RolloutRecord>> Admit(const LeasedGroup& group, int64_t learner_version,
                                                  std::optional<RefusedPrompt>* refused = nullptr);
  // The ingest's side: OK, or, once the group is dead-lettered, InvalidArgument naming the
  // reason and the field.
  absl::Status Check(absl::Span<const RolloutRecord> group, int64_t learner_version);
  // Dead-letters a group found bad elsewhere (e.g. a record that does not convert: `group`
  // holds what did) and returns Check's InvalidArgument for it.
  absl::Status Refuse(absl::Span<const RolloutRecord> group, const GroupProblem& problem);

  QuarantineCounts counts() const;
  const ModelLimits& limits() const { return limits_; }
  const std::string& path() const { return path_; }

 private:
  // One line for `group` (or, without records, for the undecodable `leased`).
  void DeadLetter(absl::Span<const RolloutRecord> group, const LeasedGroup* leased,
                  const GroupProblem& problem);
  void WriteLine(const std::string& line);  // mutex held

  const ModelLimits limits_;
  const std::string path_;
  const std::string source_;
  mutable std::mutex mu_;
  int fd_ = -1;
  QuarantineCounts counts_;
};

}  // namespace prl
