#include "episode/environment_pool.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/status_macros.h"
#include "env/builtin_environments.h"
#include "env/remote_environment.h"

namespace prl::episode {

namespace {
constexpr absl::Duration kMinProbeBackoff = absl::Milliseconds(100);
constexpr absl::Duration kMaxProbeBackoff = absl::Seconds(5);
}  // namespace

Endpoint::Endpoint(std::string name, bool remote, int max_calls)
    : name_(std::move(name)), remote_(remote), calls_(max_calls) {}

absl::StatusOr<std::shared_ptr<env::Environment>> Endpoint::ClientFor(
    const prl::v1::EnvironmentSpec& spec) {
  const double timeout_s = spec.timeout_s() > 0 ? spec.timeout_s() : 30;
  std::lock_guard<std::mutex> lock(mu_);
  const double key = remote_ ? timeout_s : 0;
  auto it = clients_.find(key);
  if (it != clients_.end()) return it->second;
  std::shared_ptr<env::Environment> made;
  if (remote_) {
    env::RemoteEnvironmentOptions o;
    o.address = spec.address();
    o.retry.timeout = absl::Seconds(timeout_s);
    o.retry.attempt_timeout = o.retry.timeout / 3;  // a hung attempt leaves time to retry
    o.retry.max_attempts = 5;
    PRL_ASSIGN_OR_RETURN(made, env::RemoteEnvironment::Connect(o));
  } else {
    PRL_ASSIGN_OR_RETURN(made, env::MakeBuiltinEnvironment(spec.name(), "environment.name"));
  }
  clients_[key] = made;
  return made;
}

void Endpoint::Observe(const absl::Status& call) {
  if (!remote_) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (call.ok()) {
    down_since_.reset();
    backoff_ = kMinProbeBackoff;
  } else if (absl::IsUnavailable(call) && !down_since_.has_value()) {
    down_since_ = absl::Now();
    ++epoch_;
    next_probe_ = absl::Now() + backoff_;
  }
}

std::optional<absl::Time> Endpoint::down_since() const {
  std::lock_guard<std::mutex> lock(mu_);
  return down_since_;
}

uint64_t Endpoint::epoch() const {
  std::lock_guard<std::mutex> lock(mu_);
  return epoch_;
}

void Endpoint::ProbeIfDue(absl::Time now) {
  std::shared_ptr<env::Environment> client;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!down_since_.has_value() || probing_ || now < next_probe_ || clients_.empty()) return;
    probing_ = true;
    client = clients_.begin()->second;
  }
  calls_.Post([this, client] {
    const absl::Status reached = client->Probe(absl::Now() + absl::Seconds(1));
    std::lock_guard<std::mutex> lock(mu_);
    probing_ = false;
    if (reached.ok()) {
      down_since_.reset();
      backoff_ = kMinProbeBackoff;
    } else {
      backoff_ = std::min(backoff_ * 2, kMaxProbeBackoff);
      next_probe_ = absl::Now() + backoff_;
    }
  });
}

void Endpoint::Shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [timeout, client] : clients_) client->Shutdown();
  }
  calls_.Shutdown();
}

absl::StatusOr<std::shared_ptr<Endpoint>> EnvironmentPool::For(
    const prl::v1::EnvironmentSpec& spec) {
  const bool remote = !spec.address().empty();
  if (!remote && !env::IsBuiltinEnvironment(spec.name())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "environment.name: expected ", env::DescribeBuiltinEnvironments(),
        " (built in) or an environment.address, found '", spec.name().substr(0, 64), "'"));
  }
  const std::string key = remote ? spec.address() : absl::StrCat("builtin:", spec.name());
  std::shared_ptr<Endpoint> endpoint;
  {
    std::lock_guard<std::mutex> lock(mu_);
    std::shared_ptr<Endpoint>& slot = by_key_[key];
    if (slot == nullptr) {
      slot = std::make_shared<Endpoint>(remote ? absl::StrCat("environment at ", spec.address())
                                               : absl::StrCat(spec.name(), " (built in)"),
                                        remote, calls_per_environment_);
    }
    endpoint = slot;
  }
  PRL_RETURN_IF_ERROR(endpoint->ClientFor(spec).status());
  return endpoint;
}

std::vector<std::shared_ptr<Endpoint>> EnvironmentPool::endpoints() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::shared_ptr<Endpoint>> out;
  for (const auto& [key, e] : by_key_) out.push_back(e);
  return out;
}

void EnvironmentPool::Shutdown() {
  for (const std::shared_ptr<Endpoint>& e : endpoints()) e->Shutdown();
}

}  // namespace prl::episode
