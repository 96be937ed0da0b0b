// Environment: one side of an agentic episode (proto/prl/v1/environment.proto,
// docs/environments.md) as a C++ interface: what prl's built-in environments implement
// (env/calculator.h, env/guess_number.h), what EnvironmentServer serves over gRPC, and what the
// actor calls through EnvironmentClient for a user's environment in another process.
//
// The calls follow the protocol: StartEpisode once per episode id, Step per (episode id, turn
// index) in turn order, EndEpisode when the actor ends an episode the environment has not;
// each is idempotent (a retry with the same arguments gets the same answer). Errors are
// absl::Status naming what is wrong (an unknown episode, a turn out of order); an environment
// that cannot go on returns an error and the actor fails the episode's attempt.
//
// Thread-safety: implementations are called from many threads at once (one episode's calls
// never overlap: the actor waits for each answer).
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "prl/v1/environment.pb.h"

namespace prl::env {

// An environment parameter, or `fallback`: of `parameters`, a string-to-string map (a
// StartEpisodeRequest's, an EnvironmentSpec's, the run config's env.params).
template <typename Map>
std::string Parameter(const Map& parameters, const std::string& key, std::string fallback) {
  auto it = parameters.find(key);
  return it == parameters.end() ? std::move(fallback) : std::string(it->second);
}
inline std::string Parameter(const v1::StartEpisodeRequest& request, const std::string& key,
                             std::string fallback) {
  return Parameter(request.parameters(), key, std::move(fallback));
}

// An integer parameter, or `fallback`; a value that is not an integer is an error naming
// `where` (the environment) and the key.
template <typename Map>
absl::StatusOr<int64_t> IntParameter(const Map& parameters, const std::string& key,
                                     int64_t fallback, absl::string_view where) {
  auto it = parameters.find(key);
  if (it == parameters.end()) return fallback;
  int64_t value = 0;
  if (!absl::SimpleAtoi(it->second, &value)) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": parameter ", key,
                                                   ": expected an integer, found '",
                                                   std::string(it->second).substr(0, 32), "'"));
  }
  return value;
}

class Environment {
 public:
  virtual ~Environment() = default;
  virtual absl::StatusOr<v1::StartEpisodeResponse> StartEpisode(
      const v1::StartEpisodeRequest& request) = 0;
  virtual absl::StatusOr<v1::StepResponse> Step(const v1::StepRequest& request) = 0;
  virtual absl::StatusOr<v1::EndEpisodeResponse> EndEpisode(
      const v1::EndEpisodeRequest& request) = 0;

  // Whether the environment can be reached by `deadline` (an in-process one always can): how an
  // actor finds out that an environment it found down is back.
  virtual absl::Status Probe(absl::Time deadline) {
    (void)deadline;
    return absl::OkStatus();
  }
  // Cancels the calls in flight and refuses new ones (CANCELLED): an actor stopping does not
  // wait for a hung environment.
  virtual void Shutdown() {}
};

}  // namespace prl::env
