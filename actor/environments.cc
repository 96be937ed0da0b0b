#include "actor/environments.h"

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "env/calculator.h"
#include "env/guess_number.h"
#include "env/remote_environment.h"

namespace prl::actor {

absl::StatusOr<std::shared_ptr<env::Environment>> EnvironmentPool::For(
    const prl::v1::EnvironmentSpec& spec) {
  const std::string key = spec.address().empty()
                              ? absl::StrCat("builtin:", spec.name())
                              : absl::StrCat(spec.address(), "/", spec.timeout_s());
  std::lock_guard<std::mutex> lock(mu_);
  auto it = by_key_.find(key);
  if (it != by_key_.end()) return it->second;
  std::shared_ptr<env::Environment> made;
  if (!spec.address().empty()) {
    env::RemoteEnvironmentOptions o;
    o.address = spec.address();
    o.retry.timeout = absl::Seconds(spec.timeout_s() > 0 ? spec.timeout_s() : 30);
    o.retry.attempt_timeout = o.retry.timeout / 3;  // a hung attempt leaves time to retry
    o.retry.max_attempts = 5;
    PRL_ASSIGN_OR_RETURN(made, env::RemoteEnvironment::Connect(o));
  } else if (spec.name() == "calculator") {
    made = std::make_shared<env::CalculatorEnvironment>();
  } else if (spec.name() == "guess_number") {
    made = std::make_shared<env::GuessNumberEnvironment>();
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "environment.name: expected calculator or guess_number, found '", spec.name(), "'"));
  }
  by_key_[key] = made;
  return made;
}

}  // namespace prl::actor
