// RemoteAgent: a user's agent (prl.v1.AgentService, docs/agents.md) served by another process:
// the client an actor's agent episodes call. RunEpisode runs the agent's whole episode — the
// agent calls the actor's OpenAI-compatible endpoint meanwhile — so it is one call with the
// episode's wall-time budget as its deadline, never retried (an episode is not idempotent: a
// failed attempt fails its group, and the coordinator runs the prompt again). The caller checks
// the answer (ValidateRunEpisodeResponse, with the calls it served); errors name the agent's
// address, the episode and what was wrong.
//
// The channel is a user-written service's (rpc::NewServiceChannel: TLS when a CA is configured;
// never a role's token, only the credential configured for this address in
// security.service_token_files); which addresses an actor may call at all is the coordinator's
// allow-list (coordinator.agent_addresses).
//
// Thread-safety: one client is shared by all of an actor's episodes with this agent.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "prl/v1/agent.grpc.pb.h"

namespace prl::env {

// A RunEpisodeResponse an episode may use: a finite reward, call_rewards empty or one per
// answered call (`calls`), each finite, a done_reason of at most 256 bytes.
absl::Status ValidateRunEpisodeResponse(const prl::v1::RunEpisodeResponse& response,
                                        int32_t calls);

class RemoteAgent {
 public:
  // Creates the channel (it connects lazily: a server that is down shows at the first call).
  static absl::StatusOr<std::unique_ptr<RemoteAgent>> Connect(const std::string& address);

  // The episode, within `timeout`. Cancel(episode_id) or Shutdown ends it early (CANCELLED).
  absl::StatusOr<prl::v1::RunEpisodeResponse> RunEpisode(const prl::v1::RunEpisodeRequest& request,
                                                         absl::Duration timeout);
  // Cancels the episode's call if it is in flight.
  void Cancel(const std::string& episode_id);
  // Cancels every call in flight; later calls fail at once (the actor is stopping).
  void Shutdown();
  const std::string& address() const { return address_; }

 private:
  explicit RemoteAgent(std::string address) : address_(std::move(address)) {}

  const std::string address_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<prl::v1::AgentService::Stub> stub_;
  std::mutex mu_;
  bool shut_down_ = false;                                   // guarded by mu_
  std::map<std::string, grpc::ClientContext*> live_;  // by episode id, guarded by mu_
};

}  // namespace prl::env
