// EnvironmentPool: the environments an actor's episodes call, one Endpoint per environment —
// a built-in one in-process (by name), or a user's EnvironmentService at an address
// (env/remote_environment.h; the coordinator allowed the address). Each endpoint has
//   - its own call threads (episode/call_queue.h, at most calls_per_environment): calls to one
//     environment never wait for another's, and a hung environment holds only its own;
//   - its health: a call that finds it down (UNAVAILABLE after the call's retries) marks it
//     down; while down it is probed (Environment::Probe) with backoff from 100 ms to 5 s, and
//     a probe or a call that gets through marks it up again. epoch() counts its outages, so an
//     episode that started before one knows that the environment may have lost it.
//
// Owns: the endpoints (shared with the jobs in flight). Thread-safety: every method may be
// called from any thread.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "env/environment.h"
#include "episode/call_queue.h"
#include "prl/v1/prompt.pb.h"

namespace prl::episode {

class Endpoint {
 public:
  Endpoint(std::string name, bool remote, int max_calls);

  // "calculator (built in)" or "environment at 127.0.0.1:7000".
  const std::string& name() const { return name_; }
  bool remote() const { return remote_; }
  // The client for a prompt set's spec (remote ones: one per call budget, timeout_s).
  absl::StatusOr<std::shared_ptr<env::Environment>> ClientFor(const prl::v1::EnvironmentSpec& spec);
  // Runs `call` on this endpoint's threads.
  void Post(std::function<void()> call) { calls_.Post(std::move(call)); }
  int64_t calls_pending() const { return calls_.pending(); }

  // A call's result: UNAVAILABLE marks the endpoint down (a new outage: epoch + 1), success up.
  void Observe(const absl::Status& call);
  // Since when it is down (nullopt: up).
  std::optional<absl::Time> down_since() const;
  uint64_t epoch() const;
  // While down: starts a probe when its backoff has passed (one at a time).
  void ProbeIfDue(absl::Time now);
  // Cancels every call in flight and stops the threads (the actor is stopping).
  void Shutdown();

 private:
  const std::string name_;
  const bool remote_;
  mutable std::mutex mu_;
  std::map<double, std::shared_ptr<env::Environment>> clients_;  // by timeout_s
  std::optional<absl::Time> down_since_;
  uint64_t epoch_ = 0;
  bool probing_ = false;
  absl::Time next_probe_ = absl::InfinitePast();
  absl::Duration backoff_ = absl::Milliseconds(100);
  CallQueue calls_;  // last: its threads stop before the clients go
};

class EnvironmentPool {
 public:
  explicit EnvironmentPool(int calls_per_environment)
      : calls_per_environment_(calls_per_environment) {}
  ~EnvironmentPool() { Shutdown(); }

  // The endpoint of a spec: the built-in by name, else the address; an unknown built-in name is
  // InvalidArgument naming environment.name.
  absl::StatusOr<std::shared_ptr<Endpoint>> For(const prl::v1::EnvironmentSpec& spec);
  // Every endpoint, for probing (EpisodeEngine::Step).
  std::vector<std::shared_ptr<Endpoint>> endpoints() const;
  void Shutdown();

 private:
  const int calls_per_environment_;
  mutable std::mutex mu_;
  std::map<std::string, std::shared_ptr<Endpoint>> by_key_;
};

}  // namespace prl::episode
