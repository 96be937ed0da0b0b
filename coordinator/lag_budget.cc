#include "coordinator/lag_budget.h"

#include <algorithm>
#include <climits>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace prl::coordinator {

LagBudget::LagBudget(int64_t max_lag, int64_t groups_per_step, bool sync, int64_t groups_completed,
                     uint64_t start_unix_ns)
    : max_lag_(max_lag),
      groups_per_step_(groups_per_step),
      sync_(sync),
      completed_at_report_(groups_completed),
      start_unix_ns_(start_unix_ns != 0 ? start_unix_ns
                                        : static_cast<uint64_t>(absl::GetCurrentTimeNanos())),
      completed_at_start_(groups_completed) {}

int64_t LagBudget::Allowed(int64_t requested, int64_t in_flight, int64_t groups_completed) const {
  if (groups_per_step_ <= 0) return requested;
  const int64_t lag = sync_ ? 0 : max_lag_;
  const int64_t budget = (lag + 1) * groups_per_step_ - in_flight - Unconsumed(groups_completed);
  return std::min(requested, budget);
}

int64_t LagBudget::Unconsumed(int64_t groups_completed) const {
  return std::max<int64_t>(0, backlog_at_report_ + groups_completed - completed_at_report_);
}

void LagBudget::ForgetCompletion(int64_t groups_completed) {
  if (Unconsumed(groups_completed) > 0) ++completed_at_report_;
}

absl::Status LagBudget::Check(int64_t version, int64_t groups_consumed,
                              int64_t groups_waiting) const {
  // Any version after this coordinator starts (the learner's numbering goes on); then at most
  // kMaxVersionStep ahead of the last (a learner advances one version a step).
  const int64_t max_version = reported_ ? learner_version_ + kMaxVersionStep : INT64_MAX;
  if (version < 0 || version > max_version || groups_consumed < 0 || groups_waiting < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("learner progress: expected 0 <= version <= ", max_version,
                     " and groups_consumed, groups_waiting >= 0; found version ", version,
                     ", groups_consumed ", groups_consumed, ", groups_waiting ", groups_waiting));
  }
  return absl::OkStatus();
}

absl::StatusOr<prl::v1::LearnerProgressResponse> LagBudget::Report(
    int64_t version, int64_t groups_consumed, int64_t groups_waiting,
    const prl::v1::LearnerProgressResponse* seen, int64_t groups_completed) {
  if (absl::Status s = Check(version, groups_consumed, groups_waiting); !s.ok()) return s;
  // A restarted learner may report a lower version: its numbering continues above what the
  // actors hold, so the highest one is the newest weights.
  learner_version_ = std::max(learner_version_, version);
  groups_consumed_ = groups_consumed;
  reported_ = true;
  backlog_at_report_ = groups_waiting;
  if (seen == nullptr) {
    completed_at_report_ = groups_completed;  // a learner's first report
  } else if (seen->coordinator_start() == start_unix_ns_ &&
             seen->completions() <= groups_completed) {
    completed_at_report_ = seen->completions();  // the learner read its backlog after this
  } else {
    completed_at_report_ = completed_at_start_;  // a predecessor's reply: all of ours unseen
  }
  prl::v1::LearnerProgressResponse response;
  response.set_completions(groups_completed);
  response.set_coordinator_start(start_unix_ns_);
  return response;
}

}  // namespace prl::coordinator
