#include "env/remote_environment.h"

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "env/episode_protocol.h"
#include "rpc/grpc_util.h"
#include "rpc/security.h"

namespace prl::env {

absl::StatusOr<std::unique_ptr<RemoteEnvironment>> RemoteEnvironment::Connect(
    const RemoteEnvironmentOptions& options) {
  if (options.address.empty()) {
    return absl::InvalidArgumentError("environment: address: expected host:port, found none");
  }
  PRL_RETURN_IF_ERROR(rpc::ValidateRetryPolicy(options.retry, "environment"));
  auto env = std::unique_ptr<RemoteEnvironment>(new RemoteEnvironment(options));
  grpc::ChannelArguments args = rpc::ChannelArgs(options.max_message_bytes);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  // (Not GRPC_ARG_MIN_RECONNECT_BACKOFF_MS: gRPC takes it as each connection attempt's timeout,
  // and at 100 ms a loaded host's handshake fails and backs off again.)
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2000);
  env->channel_ = rpc::NewServiceChannel(options.address, args);
  env->stub_ = v1::EnvironmentService::NewStub(env->channel_);
  return env;
}

template <typename Request, typename Response, typename Rpc>
absl::StatusOr<Response> RemoteEnvironment::Call(const std::string& what, const Request& request,
                                                 Rpc rpc) {
  Response response;
  const rpc::RetryOutcome outcome = rpc::CallWithRetries(options_.retry, [&](absl::Time deadline) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(deadline));
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (shut_down_) return absl::CancelledError("the actor is stopping");
      live_.insert(&context);
    }
    response.Clear();
    absl::Status s = rpc::FromGrpcStatus((stub_.get()->*rpc)(&context, request, &response));
    std::lock_guard<std::mutex> lock(mu_);
    live_.erase(&context);
    return s;
  });
  if (!outcome.status.ok()) {
    return absl::Status(outcome.status.code(),
                        absl::StrCat("environment at ", options_.address, ": ", what, ": ",
                                     outcome.why, "; last error: ", outcome.status.message()));
  }
  return response;
}

absl::StatusOr<v1::StartEpisodeResponse> RemoteEnvironment::StartEpisode(
    const v1::StartEpisodeRequest& request) {
  const std::string what = absl::StrCat("StartEpisode of episode '", request.episode_id(), "'");
  PRL_ASSIGN_OR_RETURN(v1::StartEpisodeResponse r,
                       (Call<v1::StartEpisodeRequest, v1::StartEpisodeResponse>(
                           what, request, &v1::EnvironmentService::Stub::StartEpisode)));
  if (absl::Status valid = ValidateStartResponse(r); !valid.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("environment at ", options_.address, ": ", what, ": ", valid.message()));
  }
  return r;
}

absl::StatusOr<v1::StepResponse> RemoteEnvironment::Step(const v1::StepRequest& request) {
  const std::string what =
      absl::StrCat("Step turn ", request.turn_index(), " of episode '", request.episode_id(), "'");
  PRL_ASSIGN_OR_RETURN(v1::StepResponse r,
                       (Call<v1::StepRequest, v1::StepResponse>(
                           what, request, &v1::EnvironmentService::Stub::Step)));
  if (absl::Status valid = ValidateStepResponse(r); !valid.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("environment at ", options_.address, ": ", what, ": ", valid.message()));
  }
  return r;
}

absl::StatusOr<v1::EndEpisodeResponse> RemoteEnvironment::EndEpisode(
    const v1::EndEpisodeRequest& request) {
  const std::string what = absl::StrCat("EndEpisode of episode '", request.episode_id(), "'");
  PRL_ASSIGN_OR_RETURN(v1::EndEpisodeResponse r,
                       (Call<v1::EndEpisodeRequest, v1::EndEpisodeResponse>(
                           what, request, &v1::EnvironmentService::Stub::EndEpisode)));
  if (absl::Status valid = ValidateEndResponse(r); !valid.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("environment at ", options_.address, ": ", what, ": ", valid.message()));
  }
  return r;
}

absl::Status RemoteEnvironment::Probe(absl::Time deadline) {
  if (channel_->WaitForConnected(absl::ToChronoTime(deadline))) return absl::OkStatus();
  return absl::UnavailableError(
      absl::StrCat("environment at ", options_.address, ": not reachable"));
}

void RemoteEnvironment::Shutdown() {
  std::lock_guard<std::mutex> lock(mu_);
  shut_down_ = true;
  for (grpc::ClientContext* context : live_) context->TryCancel();
}

}  // namespace prl::env
