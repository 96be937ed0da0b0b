// CoordinatorServer: the coordinator's gRPC face — prl.v1.PromptService for clients and
// prl.v1.ActorControl for actors — with gRPC health checking and reflection, and a thread
// that re-queues expired leases once a second. LeasePrompts and Complete, the calls every
// actor makes per group, run on gRPC's callback API (a completion is answered by the prompt
// log's flusher once durable); the rest on the synchronous API's thread pool.
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "coordinator/coordinator.h"

namespace prl::coordinator {

class CoordinatorServer {
 public:
  // Serves `coordinator` (which must outlive the server) on `address` (port 0: any free port).
  // At most `max_watch_streams` WatchPromptSet streams are open at once (each holds a server
  // thread); more are RESOURCE_EXHAUSTED.
  static absl::StatusOr<std::unique_ptr<CoordinatorServer>> Start(Coordinator* coordinator,
                                                                  const std::string& address,
                                                                  int max_watch_streams = 64);
  ~CoordinatorServer();

  int port() const { return port_; }
  void Shutdown();

 private:
  class Prompts;
  class Actors;
  CoordinatorServer() = default;

  Coordinator* coordinator_ = nullptr;
  std::unique_ptr<Prompts> prompts_;
  std::unique_ptr<Actors> actors_;
  std::unique_ptr<grpc::Server> server_;
  std::atomic<bool> stopping_{false};
  std::thread expirer_;
  int port_ = 0;
};

}  // namespace prl::coordinator
