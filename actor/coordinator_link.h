// CoordinatorLink: the actor's calls to the coordinator (prl.v1.ActorControl): registration
// with its capacity, heartbeats listing the leases it holds, leases into free room, releases
// with their reasons, and completions. Transient errors (UNAVAILABLE, DEADLINE_EXCEEDED,
// ABORTED) are the callers' to retry; a coordinator that forgot the actor (NOT_FOUND after its
// restart) is answered by registering again.
//
// Owns: the stub, the actor id the coordinator gave (re-registering replaces it) and the
// heartbeat period it asked for. Thread-safety: the control thread registers, heartbeats,
// leases and releases; the finisher completes (Complete and ActorId may be called from any
// thread).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "absl/status/statusor.h"
#include "actor/actor_stats.h"
#include "actor/lease_book.h"
#include "prl/v1/prompt.grpc.pb.h"

namespace prl::actor {

bool Transient(const absl::Status& status);

class CoordinatorLink {
 public:
  CoordinatorLink(const std::string& address, std::string name, prl::v1::ActorCapacity capacity,
                  ActorStatsBoard* stats);

  // Registers, retrying transient errors with backoff until *stop.
  absl::Status Register(const std::atomic<bool>* stop);
  // A heartbeat; what the coordinator asks back (reclaimed or lost leases) goes to the book.
  absl::Status Heartbeat(int64_t weight_version, LeaseBook& book);
  // Leases up to the book's room; grants go into the book. A response too large to receive
  // (RESOURCE_EXHAUSTED) is not an error: the next leases come one prompt at a time.
  absl::Status LeaseMore(LeaseBook& book);
  // Sends the book's queued releases. One that fails is left to the next heartbeat, which no
  // longer lists its lease.
  void SendReleases(LeaseBook& book);
  // Reports a written group. Returns the coordinator's answer (FAILED_PRECONDITION: the lease
  // is no longer this actor's); a duplicate completion is counted.
  absl::Status Complete(prl::v1::CompleteRequest complete);

  std::string ActorId() const;
  int64_t heartbeat_ms() const { return heartbeat_ms_.load(); }

 private:
  const std::string name_;
  const prl::v1::ActorCapacity capacity_;
  ActorStatsBoard* stats_;
  std::unique_ptr<prl::v1::ActorControl::Stub> stub_;
  mutable std::mutex mu_;
  std::string actor_id_;  // guarded by mu_
  std::atomic<int64_t> heartbeat_ms_{5000};
  int64_t one_at_a_time_ = 0;  // leases left to ask one prompt at a time (the control thread)
};

}  // namespace prl::actor
