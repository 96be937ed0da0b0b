// EnvironmentServer: serves C++ Environments (env/environment.h) as prl.v1.EnvironmentService
// over gRPC, with the process's security (rpc/security.h): prl's built-in environments for
// tests, benchmarks and `prl env serve`, or a user's C++ environment.
//
// Several environments may share one server: StartEpisode picks one by
// StartEpisodeRequest.environment (empty: the only one, when there is one), and the episode's
// later calls go to the same one (the server remembers the most recent 100,000 episodes).
//
// Thread-safety: the environments are called on gRPC's threads, concurrently.
#pragma once

#include <grpcpp/grpcpp.h>

#include <map>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "env/environment.h"

namespace prl::env {

struct EnvironmentServerOptions {
  std::string address = "127.0.0.1:0";  // loopback by default; port 0 picks a free one
  int64_t max_message_bytes = int64_t{16} << 20;
};

class EnvironmentServer {
 public:
  static absl::StatusOr<std::unique_ptr<EnvironmentServer>> Start(
      std::map<std::string, std::shared_ptr<Environment>> environments,
      const EnvironmentServerOptions& options);
  ~EnvironmentServer();

  int port() const { return port_; }
  void Shutdown();

 private:
  class Service;
  EnvironmentServer() = default;
  std::unique_ptr<Service> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

}  // namespace prl::env
