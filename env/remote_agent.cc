#include "env/remote_agent.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "rpc/grpc_util.h"
#include "rpc/security.h"

namespace prl::env {

absl::Status ValidateRunEpisodeResponse(const prl::v1::RunEpisodeResponse& r, int32_t calls) {
  if (!std::isfinite(r.reward())) {
    return absl::InvalidArgumentError(
        absl::StrCat("RunEpisodeResponse.reward: expected a finite number, found ", r.reward()));
  }
  if (r.call_rewards_size() != 0 && r.call_rewards_size() != calls) {
    return absl::InvalidArgumentError(absl::StrCat(
        "RunEpisodeResponse.call_rewards: expected none or one per call of the episode (", calls,
        "), found ", r.call_rewards_size()));
  }
  for (int i = 0; i < r.call_rewards_size(); ++i) {
    if (!std::isfinite(r.call_rewards(i))) {
      return absl::InvalidArgumentError(absl::StrCat("RunEpisodeResponse.call_rewards[", i,
                                                     "]: expected a finite number, found ",
                                                     r.call_rewards(i)));
    }
  }
  if (r.done_reason().size() > 256) {
    return absl::InvalidArgumentError(
        absl::StrCat("RunEpisodeResponse.done_reason: expected at most 256 bytes, found ",
                     r.done_reason().size()));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<RemoteAgent>> RemoteAgent::Connect(const std::string& address) {
  if (address.empty()) {
    return absl::InvalidArgumentError("agent.address: expected host:port, found none");
  }
  auto agent = std::unique_ptr<RemoteAgent>(new RemoteAgent(address));
  grpc::ChannelArguments args = rpc::ChannelArgs(int64_t{16} << 20);
  // (Not GRPC_ARG_MIN_RECONNECT_BACKOFF_MS: gRPC takes it as the connection attempt's timeout, and
  // at 100 ms a loaded host or a TLS handshake fails the never-retried RunEpisode UNAVAILABLE.)
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2000);
  agent->channel_ = rpc::NewServiceChannel(address, args);
  agent->stub_ = prl::v1::AgentService::NewStub(agent->channel_);
  return agent;
}

absl::StatusOr<prl::v1::RunEpisodeResponse> RemoteAgent::RunEpisode(
    const prl::v1::RunEpisodeRequest& request, absl::Duration timeout) {
  const std::string what =
      absl::StrCat("agent at ", address_, ": RunEpisode of episode '", request.episode_id(), "'");
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shut_down_) return absl::CancelledError(absl::StrCat(what, ": the actor is stopping"));
    live_[request.episode_id()] = &context;
  }
  prl::v1::RunEpisodeResponse response;
  const absl::Status s = rpc::FromGrpcStatus(stub_->RunEpisode(&context, request, &response));
  {
    std::lock_guard<std::mutex> lock(mu_);
    live_.erase(request.episode_id());
  }
  if (absl::IsDeadlineExceeded(s)) {
    return absl::DeadlineExceededError(
        absl::StrCat(what, ": no answer within the episode's ", absl::FormatDuration(timeout),
                     " (agent.timeout_s)"));
  }
  if (!s.ok()) return absl::Status(s.code(), absl::StrCat(what, ": ", s.message()));
  return response;
}

void RemoteAgent::Cancel(const std::string& episode_id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.find(episode_id);
  if (it != live_.end()) it->second->TryCancel();
}

void RemoteAgent::Shutdown() {
  std::lock_guard<std::mutex> lock(mu_);
  shut_down_ = true;
  for (auto& [id, context] : live_) context->TryCancel();
}

}  // namespace prl::env
