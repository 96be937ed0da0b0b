#include "actor/coordinator_link.h"

#include <chrono>
#include <cstdio>

#include "absl/time/clock.h"
#include "core/status_macros.h"
#include "rpc/grpc_util.h"
#include "rpc/security.h"

namespace prl::actor {

namespace v1 = prl::v1;

bool Transient(const absl::Status& s) {
  return absl::IsUnavailable(s) || absl::IsDeadlineExceeded(s) || absl::IsAborted(s);
}

namespace {

void SetDeadline(grpc::ClientContext& ctx, int seconds) {
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(seconds));
}

}  // namespace

CoordinatorLink::CoordinatorLink(const std::string& address, std::string name,
                                 v1::ActorCapacity capacity, ActorStatsBoard* stats)
    : name_(std::move(name)),
      capacity_(std::move(capacity)),
      stats_(stats),
      stub_(v1::ActorControl::NewStub(
          rpc::NewChannel(address, rpc::ChannelArgs(int64_t{64} << 20)))) {}

std::string CoordinatorLink::ActorId() const {
  std::lock_guard<std::mutex> lock(mu_);
  return actor_id_;
}

absl::Status CoordinatorLink::Register(const std::atomic<bool>* stop) {
  absl::Duration backoff = absl::Milliseconds(100);
  while (!stop->load()) {
    grpc::ClientContext ctx;
    SetDeadline(ctx, 10);
    v1::RegisterRequest request;
    request.set_actor_name(name_);
    *request.mutable_capacity() = capacity_;
    v1::RegisterResponse response;
    const absl::Status s = rpc::FromGrpcStatus(stub_->Register(&ctx, request, &response));
    if (s.ok()) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        actor_id_ = response.actor_id();
      }
      heartbeat_ms_ = response.heartbeat_ms();
      stats_->Update([](ActorStats& st) { ++st.registrations; });
      return absl::OkStatus();
    }
    if (!Transient(s)) return s;
    absl::SleepFor(backoff);  // the coordinator may start after us, or be restarting
    backoff = std::min(backoff * 2, absl::Seconds(2));
  }
  return absl::CancelledError("actor stopped before it could register");
}

absl::Status CoordinatorLink::Heartbeat(int64_t weight_version, LeaseBook& book) {
  grpc::ClientContext ctx;
  SetDeadline(ctx, 10);
  v1::HeartbeatRequest request;
  request.set_weight_version(weight_version);
  request.set_actor_id(ActorId());
  for (const std::string& id : book.HeldForHeartbeat()) request.add_held_lease_ids(id);
  v1::HeartbeatResponse response;
  PRL_RETURN_IF_ERROR(rpc::FromGrpcStatus(stub_->Heartbeat(&ctx, request, &response)));
  if (!response.reclaim_lease_ids().empty() || !response.lost_lease_ids().empty()) {
    book.GiveBack({response.reclaim_lease_ids().begin(), response.reclaim_lease_ids().end()},
                  {response.lost_lease_ids().begin(), response.lost_lease_ids().end()});
  }
  return absl::OkStatus();
}

absl::Status CoordinatorLink::LeaseMore(LeaseBook& book) {
  const int64_t room = book.Room();
  if (room <= 0) return absl::OkStatus();
  v1::LeaseRequest request;
  request.set_actor_id(ActorId());
  // After a response too large to receive, one prompt at a time for a while.
  const int64_t ask = one_at_a_time_ > 0 ? 1 : room;
  request.set_max_prompts(static_cast<int32_t>(ask));
  grpc::ClientContext ctx;
  SetDeadline(ctx, 10);
  v1::LeaseResponse response;
  const absl::Status leased = rpc::FromGrpcStatus(stub_->LeasePrompts(&ctx, request, &response));
  if (absl::IsResourceExhausted(leased)) {
    // A response beyond this actor's receive limit: those leases were never delivered (they
    // expire and are re-run); never a reason to stop the actor.
    std::fprintf(stderr,
                 "actor %s: a lease response could not be received (%s); leasing one "
                 "prompt at a time\n",
                 name_.c_str(), std::string(leased.message()).c_str());
    one_at_a_time_ = 100;
    return absl::OkStatus();
  }
  PRL_RETURN_IF_ERROR(leased);
  if (one_at_a_time_ > 0) --one_at_a_time_;
  if (!response.prompts().empty()) book.Grant(response);
  return absl::OkStatus();
}

void CoordinatorLink::SendReleases(LeaseBook& book) {
  const std::string actor_id = ActorId();
  for (v1::ReleaseRequest& release : book.TakeReleases()) {
    release.set_actor_id(actor_id);
    grpc::ClientContext ctx;
    SetDeadline(ctx, 10);
    v1::ReleaseResponse response;
    const absl::Status s = rpc::FromGrpcStatus(stub_->Release(&ctx, release, &response));
    if (!s.ok()) {
      // The lease already ended (expired, re-registered) or the coordinator is away: the next
      // heartbeat no longer lists it, so it is re-queued anyway.
      std::fprintf(stderr, "actor %s: cannot release %s: %s\n", name_.c_str(),
                   release.lease_id().c_str(), std::string(s.message()).c_str());
      continue;
    }
    stats_->Update([](ActorStats& st) { ++st.leases_released; });
  }
}

absl::Status CoordinatorLink::Complete(v1::CompleteRequest complete) {
  complete.set_actor_id(ActorId());
  grpc::ClientContext ctx;
  SetDeadline(ctx, 30);
  v1::CompleteResponse response;
  const absl::Status done = rpc::FromGrpcStatus(stub_->Complete(&ctx, complete, &response));
  if (done.ok() && !response.accepted()) {
    stats_->Update([](ActorStats& st) { ++st.duplicate_completions; });
  }
  return done;
}

}  // namespace prl::actor
