#include "reward/reward_service.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/status_macros.h"
#include "rpc/grpc_util.h"
#include "rpc/retry.h"

namespace prl::reward {

namespace {

void ToProto(const RewardInput& in, v1::RewardSample* out) {
  out->set_prompt(in.prompt);
  out->set_completion(in.completion);
  out->set_reference(in.reference);
  out->mutable_prompt_tokens()->Add(in.prompt_tokens.begin(), in.prompt_tokens.end());
  out->mutable_completion_tokens()->Add(in.completion_tokens.begin(), in.completion_tokens.end());
  out->set_group_id(in.group_id);
}

RewardInput FromProto(const v1::RewardSample& s) {
  RewardInput in;
  in.prompt = s.prompt();
  in.completion = s.completion();
  in.reference = s.reference();
  in.prompt_tokens.assign(s.prompt_tokens().begin(), s.prompt_tokens().end());
  in.completion_tokens.assign(s.completion_tokens().begin(), s.completion_tokens().end());
  in.group_id = s.group_id();
  return in;
}

// Codes a later attempt may not see again: the server restarting, overloaded or crashing on
// this request. The others (INVALID_ARGUMENT, UNIMPLEMENTED, ...) would fail the same way.
// "group 7" or "groups 7, 8": the groups a failed batch held, for the error message.
std::string DescribeGroups(absl::Span<const RewardInput> inputs) {
  std::vector<uint64_t> ids;
  for (const RewardInput& in : inputs) {
    if (std::find(ids.begin(), ids.end(), in.group_id) == ids.end()) ids.push_back(in.group_id);
  }
  return absl::StrCat(ids.size() == 1 ? "group " : "groups ", absl::StrJoin(ids, ", "));
}

}  // namespace

absl::Status ValidateRemoteRewardOptions(const RemoteRewardOptions& options) {
  if (options.address.empty()) {
    return absl::InvalidArgumentError("remote reward: address must be host:port, found \"\"");
  }
  if (options.timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat("remote reward: timeout must be > 0, found ",
                                                   absl::FormatDuration(options.timeout)));
  }
  if (options.max_attempts < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("remote reward: max_attempts must be >= 1, found ", options.max_attempts));
  }
  if (options.initial_backoff < absl::ZeroDuration() ||
      options.max_backoff < options.initial_backoff) {
    return absl::InvalidArgumentError(absl::StrCat(
        "remote reward: backoff must satisfy 0 <= initial_backoff <= max_backoff, found ",
        absl::FormatDuration(options.initial_backoff), " and ",
        absl::FormatDuration(options.max_backoff)));
  }
  if (options.max_message_bytes < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "remote reward: max_message_bytes must be >= 1, found ", options.max_message_bytes));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<RemoteReward>> RemoteReward::Connect(
    const RemoteRewardOptions& options) {
  PRL_RETURN_IF_ERROR(ValidateRemoteRewardOptions(options));
  auto reward = std::unique_ptr<RemoteReward>(new RemoteReward(options));
  grpc::ChannelArguments args = rpc::ChannelArgs(options.max_message_bytes);
  // gRPC's reconnect backoff grows to 120 s by default: a reward server back after a restart
  // would stay unreachable far beyond our retries. Bound it by ours.
  const auto ms = [](absl::Duration d) {
    return static_cast<int>(std::clamp<int64_t>(absl::ToInt64Milliseconds(d), 1, 60'000));
  };
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, ms(options.initial_backoff));
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, ms(options.max_backoff));
  reward->stub_ = v1::RewardService::NewStub(rpc::NewServiceChannel(options.address, args));
  return reward;
}

absl::StatusOr<double> RemoteReward::Score(const RewardInput& input) {
  PRL_ASSIGN_OR_RETURN(const std::vector<RewardResult> results,
                       ScoreBatch(absl::MakeConstSpan(&input, 1)));
  return results[0].reward;
}

absl::StatusOr<std::vector<RewardResult>> RemoteReward::ScoreBatch(
    absl::Span<const RewardInput> inputs) {
  if (inputs.empty()) return std::vector<RewardResult>();
  v1::ScoreRequest request;
  for (const RewardInput& in : inputs) ToProto(in, request.add_samples());

  rpc::RetryPolicy policy;
  policy.timeout = options_.timeout;
  policy.max_attempts = options_.max_attempts;
  policy.initial_backoff = options_.initial_backoff;
  policy.max_backoff = options_.max_backoff;
  v1::ScoreResponse response;
  const rpc::RetryOutcome outcome = rpc::CallWithRetries(policy, [&](absl::Time deadline) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(deadline));
    response.Clear();
    return rpc::FromGrpcStatus(stub_->Score(&context, request, &response));
  });
  if (outcome.status.ok()) return ReadResponse(response, inputs);
  const absl::Status& last = outcome.status;
  const bool all = outcome.attempts == options_.max_attempts;
  return absl::Status(
      last.code(),
      absl::StrCat("reward service at ", options_.address, ": ", outcome.attempts, " of ",
                   options_.max_attempts, " attempts failed (budget ",
                   absl::FormatDuration(options_.timeout), all ? "" : ", ", all ? "" : outcome.why,
                   "); last error: ", last.message(), "; no reward for the batch of ",
                   inputs.size(), " samples (", DescribeGroups(inputs), ")"));
}

absl::StatusOr<std::vector<RewardResult>> RemoteReward::ReadResponse(
    const v1::ScoreResponse& response, absl::Span<const RewardInput> inputs) {
  if (static_cast<size_t>(response.rewards_size()) != inputs.size()) {
    return absl::InternalError(absl::StrCat("reward service at ", options_.address, " returned ",
                                            response.rewards_size(), " rewards for ", inputs.size(),
                                            " samples (expected one per sample, in order; ",
                                            DescribeGroups(inputs), ")"));
  }
  std::vector<RewardResult> results(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    const v1::SampleReward& r = response.rewards(static_cast<int>(i));
    const std::string where = absl::StrCat(" for sample ", i, " (group ", inputs[i].group_id, ")");
    if (!std::isfinite(r.reward())) {
      return absl::InternalError(absl::StrCat("reward service at ", options_.address,
                                              " returned a non-finite reward (", r.reward(), ")",
                                              where));
    }
    results[i].reward = r.reward();
    for (const auto& [name, value] : r.components()) {
      if (!std::isfinite(value)) {
        return absl::InternalError(absl::StrCat("reward service at ", options_.address,
                                                " returned a non-finite component '", name, "' (",
                                                value, ")", where));
      }
      results[i].components[name] = value;
    }
  }
  return results;
}

class RewardServer::Service final : public v1::RewardService::Service {
 public:
  explicit Service(RewardCallback callback) : callback_(std::move(callback)) {}

  grpc::Status Score(grpc::ServerContext*, const v1::ScoreRequest* request,
                     v1::ScoreResponse* response) override {
    return rpc::Guarded("prl.v1.RewardService/Score", [&]() -> grpc::Status {
      std::vector<RewardInput> inputs;
      inputs.reserve(request->samples_size());
      for (const v1::RewardSample& s : request->samples()) inputs.push_back(FromProto(s));
      absl::StatusOr<std::vector<RewardResult>> results = callback_(inputs);
      if (!results.ok()) return rpc::ToGrpcStatus(results.status());
      for (const RewardResult& r : *results) {
        v1::SampleReward* out = response->add_rewards();
        out->set_reward(r.reward);
        for (const auto& [name, value] : r.components) (*out->mutable_components())[name] = value;
      }
      return grpc::Status::OK;
    });
  }

 private:
  RewardCallback callback_;
};

absl::StatusOr<std::unique_ptr<RewardServer>> RewardServer::Start(
    RewardCallback callback, const RewardServerOptions& options) {
  auto server = std::unique_ptr<RewardServer>(new RewardServer());
  server->service_ = std::make_unique<Service>(std::move(callback));
  grpc::ServerBuilder builder;
  rpc::ConfigureServerBuilder(builder, options.max_message_bytes);
  builder.RegisterService(server->service_.get());
  PRL_ASSIGN_OR_RETURN(server->server_, rpc::StartServer(builder, options.address, &server->port_));
  return server;
}

RewardServer::~RewardServer() { Shutdown(); }

void RewardServer::Shutdown() {
  if (server_ != nullptr) server_->Shutdown();
}

void RewardServer::Wait() {
  if (server_ != nullptr) server_->Wait();
}

}  // namespace prl::reward
