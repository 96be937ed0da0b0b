// RemoteEnvironment: an Environment (env/environment.h) served by another process over gRPC
// (prl.v1.EnvironmentService): the client the actor's episodes call. Every call is retried on
// transient errors within env.timeout_s (rpc/retry.h: the protocol makes retries safe), and
// every answer is checked (env/episode_protocol.h) before it is used; errors name the
// environment's address, the call, the episode and what was wrong.
//
// The channel is a user-written service's (rpc::NewServiceChannel: TLS to servers when a CA is
// configured; never a role's token, only the credential configured for this address in
// security.service_token_files); which addresses an actor may call at all is the coordinator's
// allow-list (coordinator.env_addresses).
//
// Reconnects back off from 100 ms to 2 s (gRPC's default grows to 2 minutes), so that an
// environment that restarts is found again within seconds.
//
// Thread-safety: one client is shared by all of an actor's episodes.
#pragma once

#include <memory>
#include <mutex>
#include <set>
#include <string>

#include "absl/status/statusor.h"
#include "env/environment.h"
#include "prl/v1/environment.grpc.pb.h"
#include "rpc/retry.h"

namespace prl::env {

struct RemoteEnvironmentOptions {
  std::string address;  // host:port
  rpc::RetryPolicy retry;
  int64_t max_message_bytes = int64_t{16} << 20;
};

class RemoteEnvironment final : public Environment {
 public:
  // Validates the options and creates the channel (connects lazily: a down server shows up at
  // the first call, naming the address).
  static absl::StatusOr<std::unique_ptr<RemoteEnvironment>> Connect(
      const RemoteEnvironmentOptions& options);

  absl::StatusOr<v1::StartEpisodeResponse> StartEpisode(
      const v1::StartEpisodeRequest& request) override;
  absl::StatusOr<v1::StepResponse> Step(const v1::StepRequest& request) override;
  absl::StatusOr<v1::EndEpisodeResponse> EndEpisode(const v1::EndEpisodeRequest& request) override;
  // The channel connects (TCP and HTTP/2) by `deadline`; UNAVAILABLE naming the address else.
  absl::Status Probe(absl::Time deadline) override;
  void Shutdown() override;

 private:
  explicit RemoteEnvironment(const RemoteEnvironmentOptions& options) : options_(options) {}
  // One call with retries; `what` names it in errors ("Step turn 3 of episode 'x'").
  template <typename Request, typename Response, typename Rpc>
  absl::StatusOr<Response> Call(const std::string& what, const Request& request, Rpc rpc);

  RemoteEnvironmentOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::EnvironmentService::Stub> stub_;
  std::mutex mu_;
  bool shut_down_ = false;               // guarded by mu_
  std::set<grpc::ClientContext*> live_;  // calls in flight, guarded by mu_
};

}  // namespace prl::env
