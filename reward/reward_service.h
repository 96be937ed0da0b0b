// The external reward: a RewardService (proto/prl/v1/reward.proto) that users implement in any
// language, the client actors score through (RemoteReward), and a server helper that hosts a
// C++ callback as a RewardService (tests, examples, or serving prl's built-in verifiers).
//
// RemoteReward sends a batch (usually one group) in one Score call. Transient errors
// (UNAVAILABLE, RESOURCE_EXHAUSTED, ABORTED, INTERNAL, UNKNOWN) are retried with exponential,
// jittered backoff while attempts and the call's time budget last; other codes are not
// retried. When the retries are exhausted, ScoreBatch returns an error for the WHOLE batch:
// callers must fail the group visibly and never drop a sample or write part of a group
// silently (reward/reward_function.h). A response with a reward count other than the number of
// samples, or with a non-finite reward or component, is an INTERNAL error naming the index.
//
// Thread-safety: RemoteReward may be called from many threads at once (one channel, shared).
// RewardServer runs the callback on gRPC's threads, possibly concurrently: it must be
// thread-safe. Health checking and reflection are on.
#pragma once

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "prl/v1/reward.grpc.pb.h"
#include "reward/reward_function.h"

namespace prl::reward {

struct RemoteRewardOptions {
  std::string address;                         // host:port of the RewardService
  absl::Duration timeout = absl::Seconds(30);  // budget of one ScoreBatch: attempts + backoff
  int max_attempts = 3;                        // >= 1; 1 disables retries
  absl::Duration initial_backoff = absl::Milliseconds(100);  // before the 1st retry, >= 0
  absl::Duration max_backoff = absl::Seconds(5);  // the delay doubles per retry up to this
  int64_t max_message_bytes = int64_t{64} << 20;  // a batch of long completions exceeds 4 MB
};
// Errors name the field, the expected range and the found value.
absl::Status ValidateRemoteRewardOptions(const RemoteRewardOptions& options);

class RemoteReward final : public RewardFunction {
 public:
  // Validates the options and creates the channel; connects lazily (a down server shows up as
  // UNAVAILABLE at the first call, naming the address).
  static absl::StatusOr<std::unique_ptr<RemoteReward>> Connect(const RemoteRewardOptions& options);

  absl::StatusOr<double> Score(const RewardInput& input) override;  // a batch of one
  absl::StatusOr<std::vector<RewardResult>> ScoreBatch(
      absl::Span<const RewardInput> inputs) override;

 private:
  explicit RemoteReward(const RemoteRewardOptions& options) : options_(options) {}
  absl::StatusOr<std::vector<RewardResult>> ReadResponse(const v1::ScoreResponse& response,
                                                         absl::Span<const RewardInput> inputs);

  RemoteRewardOptions options_;
  std::unique_ptr<v1::RewardService::Stub> stub_;
};

// Scores one request's samples, one result per input in order. An error status is sent to the
// client as is (INVALID_ARGUMENT is not retried; UNAVAILABLE etc. are). The server does not
// check the results: the client does. To serve a RewardFunction f:
// [&f](absl::Span<const RewardInput> in) { return f.ScoreBatch(in); }.
using RewardCallback =
    std::function<absl::StatusOr<std::vector<RewardResult>>(absl::Span<const RewardInput>)>;

struct RewardServerOptions {
  std::string address = "127.0.0.1:50071";  // loopback by default; port 0 picks a free one
  int64_t max_message_bytes = int64_t{64} << 20;
};

class RewardServer {
 public:
  // Serves `callback` until Shutdown or destruction.
  static absl::StatusOr<std::unique_ptr<RewardServer>> Start(RewardCallback callback,
                                                             const RewardServerOptions& options);
  ~RewardServer();

  int port() const { return port_; }
  void Shutdown();  // waits for calls in progress
  void Wait();      // blocks until shutdown

 private:
  class Service;
  RewardServer() = default;

  std::unique_ptr<Service> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

}  // namespace prl::reward
