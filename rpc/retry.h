// Retries of idempotent client calls: the one policy prl's clients of user-served services
// (the reward service, environments) share. A call is attempted until it succeeds, fails with
// a code that is not transient, uses up its attempts, or would outlast its time budget; the
// delay between attempts doubles up to max_backoff, jittered (clients that failed together do
// not retry together).
//
// Transient codes: UNAVAILABLE, RESOURCE_EXHAUSTED, ABORTED, INTERNAL, UNKNOWN, and
// DEADLINE_EXCEEDED of one attempt while the budget lasts (attempt_timeout < timeout).
//
// Thread-safety: CallWithRetries may run on many threads at once.
#pragma once

#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace prl::rpc {

struct RetryPolicy {
  absl::Duration timeout = absl::Seconds(30);  // the whole call's budget: attempts and delays
  // One attempt's deadline (capped by the budget's); the budget's when infinite.
  absl::Duration attempt_timeout = absl::InfiniteDuration();
  int max_attempts = 3;                        // >= 1; 1 disables retries
  absl::Duration initial_backoff = absl::Milliseconds(100);
  absl::Duration max_backoff = absl::Seconds(5);
};
// Errors name the field, the expected range and the found value; `prefix` names the settings
// ("reward service" ...).
absl::Status ValidateRetryPolicy(const RetryPolicy& policy, const std::string& prefix);

bool IsTransient(absl::StatusCode code);

struct RetryOutcome {
  absl::Status status;  // OK, or the last attempt's error
  int attempts = 0;
  // Why the retries stopped, in words for an error message ("" when the call succeeded):
  // "3 of 3 attempts", "2 of 3 attempts, time budget spent", "error not transient".
  std::string why;
};
// Calls attempt(deadline) as the policy says.
RetryOutcome CallWithRetries(const RetryPolicy& policy,
                             const std::function<absl::Status(absl::Time deadline)>& attempt);

}  // namespace prl::rpc
