// Fixtures for the tests of agents' episodes: an AgentService served over gRPC on loopback whose
// episodes run a scripted function (it records every request, and may wait to be released or
// for its call to be cancelled), and the calls such an agent makes to the actor's endpoint
// (plain HTTP on loopback, as any SDK would).
#pragma once

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "prl/v1/agent.grpc.pb.h"
#include "tests/openai/http_client.h"

namespace prl::episode::testing {

using Json = nlohmann::ordered_json;

// What an agent sees of the endpoint: POSTs with the episode's key, answers parsed.
class EndpointClient {
 public:
  explicit EndpointClient(const v1::RunEpisodeRequest& request) : key_(request.api_key()) {
    const std::string& url = request.base_url();  // http://127.0.0.1:PORT/v1
    const size_t colon = url.rfind(':'), slash = url.rfind("/v1");
    EXPECT_TRUE(absl::SimpleAtoi(url.substr(colon + 1, slash - colon - 1), &port_)) << url;
  }
  // status and the parsed body (the body as a string when it is not JSON: a stream).
  std::pair<int, Json> Post(const std::string& path, const Json& body,
                            const std::string& key = "") const {
    const openai::testing::HttpAnswer a =
        openai::testing::Call(port_, boost::beast::http::verb::post, "/v1" + path,
                              key.empty() ? key_ : key, body.dump());
    const Json parsed = Json::parse(a.body, nullptr, /*allow_exceptions=*/false);
    return {a.status, parsed.is_discarded() ? Json(a.body) : parsed};
  }
  int port() const { return port_; }

 private:
  std::string key_;
  int port_ = 0;
};

// An agent whose episodes run `script` (any thread; several at once).
class ScriptedAgent final : public v1::AgentService::Service {
 public:
  using Script = std::function<grpc::Status(const v1::RunEpisodeRequest& request,
                                            grpc::ServerContext* context,
                                            v1::RunEpisodeResponse* response)>;
  explicit ScriptedAgent(Script script) : script_(std::move(script)) {}

  grpc::Status RunEpisode(grpc::ServerContext* context, const v1::RunEpisodeRequest* request,
                          v1::RunEpisodeResponse* response) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      requests_.push_back(*request);
      changed_.notify_all();
    }
    return script_(*request, context, response);
  }
  std::vector<v1::RunEpisodeRequest> requests() const {
    std::lock_guard<std::mutex> lock(mu_);
    return requests_;
  }

  // For scripts: waits until Release() or the call is cancelled (the actor gave it up); true
  // when released.
  bool WaitForRelease(grpc::ServerContext* context) {
    std::unique_lock<std::mutex> lock(mu_);
    while (!released_ && !context->IsCancelled()) {
      changed_.wait_for(lock, std::chrono::milliseconds(5));
    }
    return released_;
  }
  void Release() {
    std::lock_guard<std::mutex> lock(mu_);
    released_ = true;
    changed_.notify_all();
  }

 private:
  Script script_;
  mutable std::mutex mu_;
  std::condition_variable changed_;
  std::vector<v1::RunEpisodeRequest> requests_;
  bool released_ = false;
};

struct ServedAgent {
  std::unique_ptr<ScriptedAgent> agent;
  std::unique_ptr<grpc::Server> server;
  std::string address;

  static ServedAgent Start(ScriptedAgent::Script script) {
    ServedAgent s;
    s.agent = std::make_unique<ScriptedAgent>(std::move(script));
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(s.agent.get());
    s.server = builder.BuildAndStart();
    EXPECT_NE(s.server, nullptr);
    s.address = absl::StrCat("127.0.0.1:", port);
    return s;
  }
  ~ServedAgent() {
    if (server != nullptr) server->Shutdown(std::chrono::system_clock::now());
  }
  ServedAgent() = default;
  ServedAgent(ServedAgent&&) = default;
};

inline v1::AgentSpec AgentAt(const std::string& address, int32_t max_calls = 8,
                             double timeout_s = 30) {
  v1::AgentSpec spec;
  spec.set_name("scripted");
  spec.set_address(address);
  spec.set_max_calls(max_calls);
  spec.set_max_tokens_per_call(6);
  spec.set_timeout_s(timeout_s);
  return spec;
}

}  // namespace prl::episode::testing
