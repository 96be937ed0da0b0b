#include "rpc/retry.h"

#include <algorithm>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace prl::rpc {

absl::Status ValidateRetryPolicy(const RetryPolicy& p, const std::string& prefix) {
  auto bad = [&](const char* field, const char* expected, const std::string& found) {
    return absl::InvalidArgumentError(
        absl::StrCat(prefix, ": ", field, ": expected ", expected, ", found ", found));
  };
  if (p.timeout <= absl::ZeroDuration()) {
    return bad("timeout", "> 0", absl::FormatDuration(p.timeout));
  }
  if (p.attempt_timeout <= absl::ZeroDuration()) {
    return bad("attempt_timeout", "> 0", absl::FormatDuration(p.attempt_timeout));
  }
  if (p.max_attempts < 1) return bad("max_attempts", ">= 1", absl::StrCat(p.max_attempts));
  if (p.initial_backoff < absl::ZeroDuration()) {
    return bad("initial_backoff", ">= 0", absl::FormatDuration(p.initial_backoff));
  }
  if (p.max_backoff < p.initial_backoff) {
    return bad("max_backoff", ">= initial_backoff", absl::FormatDuration(p.max_backoff));
  }
  return absl::OkStatus();
}

bool IsTransient(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kResourceExhausted:
    case absl::StatusCode::kAborted:
    case absl::StatusCode::kInternal:
    case absl::StatusCode::kUnknown:
      return true;
    default:
      return false;
  }
}

RetryOutcome CallWithRetries(const RetryPolicy& policy,
                             const std::function<absl::Status(absl::Time deadline)>& attempt) {
  const absl::Time budget = absl::Now() + policy.timeout;
  absl::Duration backoff = policy.initial_backoff;
  RetryOutcome out;
  for (;;) {
    ++out.attempts;
    const absl::Time deadline = std::min(budget, absl::Now() + policy.attempt_timeout);
    out.status = attempt(deadline);
    if (out.status.ok()) return out;
    // A slow attempt that hit its own deadline is worth another while the budget lasts.
    const bool transient =
        IsTransient(out.status.code()) ||
        (out.status.code() == absl::StatusCode::kDeadlineExceeded && deadline < budget);
    if (!transient) {
      out.why = "error not transient: not retried";
      return out;
    }
    if (out.attempts >= policy.max_attempts) {
      out.why = absl::StrCat(out.attempts, " of ", policy.max_attempts, " attempts");
      return out;
    }
    absl::BitGen gen;
    const absl::Duration sleep = backoff * absl::Uniform(gen, 0.5, 1.0);
    if (absl::Now() + sleep >= budget) {
      out.why = absl::StrCat(out.attempts, " of ", policy.max_attempts,
                             " attempts, time budget (", absl::FormatDuration(policy.timeout),
                             ") spent");
      return out;
    }
    absl::SleepFor(sleep);
    backoff = std::min(backoff * 2, policy.max_backoff);
  }
}

}  // namespace prl::rpc
