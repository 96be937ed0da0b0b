#include "env/environment_server.h"

#include <deque>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/status_macros.h"
#include "prl/v1/environment.grpc.pb.h"
#include "rpc/grpc_util.h"

namespace prl::env {

class EnvironmentServer::Service final : public v1::EnvironmentService::Service {
 public:
  explicit Service(std::map<std::string, std::shared_ptr<Environment>> environments)
      : environments_(std::move(environments)) {}

  grpc::Status StartEpisode(grpc::ServerContext*, const v1::StartEpisodeRequest* request,
                            v1::StartEpisodeResponse* response) override {
    return rpc::Guarded("prl.v1.EnvironmentService/StartEpisode", [&]() -> grpc::Status {
      absl::StatusOr<std::shared_ptr<Environment>> env = ByName(request->environment());
      if (!env.ok()) return rpc::ToGrpcStatus(env.status());
      absl::StatusOr<v1::StartEpisodeResponse> r = (*env)->StartEpisode(*request);
      if (!r.ok()) return rpc::ToGrpcStatus(r.status());
      Remember(request->episode_id(), *env);
      *response = *std::move(r);
      return grpc::Status::OK;
    });
  }

  grpc::Status Step(grpc::ServerContext*, const v1::StepRequest* request,
                    v1::StepResponse* response) override {
    return rpc::Guarded("prl.v1.EnvironmentService/Step", [&]() -> grpc::Status {
      absl::StatusOr<std::shared_ptr<Environment>> env = OfEpisode(request->episode_id());
      if (!env.ok()) return rpc::ToGrpcStatus(env.status());
      absl::StatusOr<v1::StepResponse> r = (*env)->Step(*request);
      if (!r.ok()) return rpc::ToGrpcStatus(r.status());
      *response = *std::move(r);
      return grpc::Status::OK;
    });
  }

  grpc::Status EndEpisode(grpc::ServerContext*, const v1::EndEpisodeRequest* request,
                          v1::EndEpisodeResponse* response) override {
    return rpc::Guarded("prl.v1.EnvironmentService/EndEpisode", [&]() -> grpc::Status {
      absl::StatusOr<std::shared_ptr<Environment>> env = OfEpisode(request->episode_id());
      if (!env.ok()) return rpc::ToGrpcStatus(env.status());
      absl::StatusOr<v1::EndEpisodeResponse> r = (*env)->EndEpisode(*request);
      if (!r.ok()) return rpc::ToGrpcStatus(r.status());
      *response = *std::move(r);
      return grpc::Status::OK;
    });
  }

 private:
  static constexpr size_t kRemembered = 100'000;

  absl::StatusOr<std::shared_ptr<Environment>> ByName(const std::string& name) const {
    if (name.empty() && environments_.size() == 1) return environments_.begin()->second;
    auto it = environments_.find(name);
    if (it != environments_.end()) return it->second;
    std::vector<std::string> names;
    for (const auto& [n, e] : environments_) names.push_back(n);
    return absl::NotFoundError(absl::StrCat("environment: expected one of ",
                                            absl::StrJoin(names, ", "), ", found '",
                                            name.substr(0, 64), "'"));
  }
  void Remember(const std::string& episode, std::shared_ptr<Environment> env) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!episodes_.emplace(episode, std::move(env)).second) return;
    order_.push_back(episode);
    if (order_.size() > kRemembered) {
      episodes_.erase(order_.front());
      order_.pop_front();
    }
  }
  absl::StatusOr<std::shared_ptr<Environment>> OfEpisode(const std::string& episode) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = episodes_.find(episode);
    if (it != episodes_.end()) return it->second;
    if (environments_.size() == 1) return environments_.begin()->second;  // it will say why
    return absl::NotFoundError(absl::StrCat("episode '", episode.substr(0, 128),
                                            "' is unknown to this server: StartEpisode first"));
  }

  const std::map<std::string, std::shared_ptr<Environment>> environments_;
  std::mutex mu_;
  std::map<std::string, std::shared_ptr<Environment>> episodes_;
  std::deque<std::string> order_;
};

absl::StatusOr<std::unique_ptr<EnvironmentServer>> EnvironmentServer::Start(
    std::map<std::string, std::shared_ptr<Environment>> environments,
    const EnvironmentServerOptions& options) {
  if (environments.empty()) {
    return absl::InvalidArgumentError("environment server: expected at least one environment");
  }
  auto server = std::unique_ptr<EnvironmentServer>(new EnvironmentServer());
  server->service_ = std::make_unique<Service>(std::move(environments));
  grpc::ServerBuilder builder;
  rpc::ConfigureServerBuilder(builder, options.max_message_bytes);
  builder.RegisterService(server->service_.get());
  PRL_ASSIGN_OR_RETURN(server->server_, rpc::StartServer(builder, options.address, &server->port_));
  return server;
}

EnvironmentServer::~EnvironmentServer() { Shutdown(); }

void EnvironmentServer::Shutdown() {
  if (server_ != nullptr) server_->Shutdown();
}

}  // namespace prl::env
