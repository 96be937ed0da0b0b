// LagBudget: the coordinator's max_lag budget and the learner's progress it rests on (the
// class comment of coordinator/coordinator.h and docs/operations.md, "The lag budget").
//
// With groups_per_step > 0, prompts in flight plus groups completed but not yet trained on stay
// within (max_lag + 1) * groups_per_step (sync mode: max_lag 0), so that nothing generated is
// older than max_lag learner versions when it is trained on. "Not yet trained on" is the
// backlog the learner last reported plus the groups completed since the reply that report
// echoes (a first report: since it arrived; a predecessor coordinator's reply: since this one
// started). Neither side keeps a running total the other must agree with, so a restart of
// either never stalls the budget.
//
// Owns: the learner's newest version, its consumed count, its last backlog and the completion
// count that backlog was read at. Not thread-safe: the coordinator calls it under its mutex.
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"
#include "prl/v1/prompt.pb.h"

namespace prl::coordinator {

class LagBudget {
 public:
  static constexpr int64_t kMaxVersionStep = 1000;  // a report's version above the last one

  // groups_per_step 0: no budget. `groups_completed`: the count after the log's replay, where
  // this coordinator's counting starts. `start_unix_ns`: the coordinator's start, which its
  // replies carry (one per coordinator, shared by an adapter's budget, coordinator/adapters.h);
  // 0: now.
  LagBudget(int64_t max_lag, int64_t groups_per_step, bool sync, int64_t groups_completed,
            uint64_t start_unix_ns = 0);

  // Prompts a lease call may take of `requested`, with `in_flight` leases open and
  // `groups_completed` groups completed so far.
  int64_t Allowed(int64_t requested, int64_t in_flight, int64_t groups_completed) const;
  // Groups completed but, as far as the learner said, not yet trained on.
  int64_t Unconsumed(int64_t groups_completed) const;
  // A completed prompt was handed back (its group will not be trained): one completion fewer
  // counts against the budget.
  void ForgetCompletion(int64_t groups_completed);

  // Whether a report is within bounds (counts >= 0, a version at most kMaxVersionStep above
  // the last); FailedPrecondition naming them otherwise.
  absl::Status Check(int64_t version, int64_t groups_consumed, int64_t groups_waiting) const;
  // The learner's report (ActorControl.ReportLearnerProgress); FailedPrecondition, nothing
  // changed, out of bounds (Check).
  absl::StatusOr<prl::v1::LearnerProgressResponse> Report(
      int64_t version, int64_t groups_consumed, int64_t groups_waiting,
      const prl::v1::LearnerProgressResponse* seen, int64_t groups_completed);

  int64_t learner_version() const { return learner_version_; }
  uint64_t start_unix_ns() const { return start_unix_ns_; }
  int64_t groups_consumed() const { return groups_consumed_; }

 private:
  int64_t max_lag_, groups_per_step_;
  bool sync_;
  int64_t learner_version_ = 0, groups_consumed_ = 0;
  bool reported_ = false;
  int64_t backlog_at_report_ = 0, completed_at_report_;
  uint64_t start_unix_ns_;      // tells this coordinator's replies from a predecessor's
  int64_t completed_at_start_;  // groups_completed after the log's replay
};

}  // namespace prl::coordinator
