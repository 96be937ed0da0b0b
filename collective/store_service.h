// The rendezvous store over the network: rank 0 serves its MemoryStore as a gRPC
// prl.v1.StoreService (proto/prl/v1/store.proto) and the other ranks reach it with
// GrpcStore, a KvStore client.
//
// Get waits server-side (in slices, so that a cancelled call or a server shutdown frees its
// thread at once). Clients keep trying to reach a server that is not up yet until their
// `connect_timeout` has passed: ranks may start in any order, rank 0 last.
//
// Thread-safety: both classes may be called from several threads at once.
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "collective/kv_store.h"
#include "prl/v1/store.grpc.pb.h"
#include "rpc/security.h"

namespace prl::collective {

class StoreServer {
 public:
  // Serves `store` (which must outlive the server) on `address` (host:port; port 0 picks a
  // free one), admitting the roles `policy` names (by default the learner's ranks).
  static absl::StatusOr<std::unique_ptr<StoreServer>> Start(
      MemoryStore* store, const std::string& address,
      const rpc::AccessPolicy& policy = rpc::DefaultAccessPolicy());
  ~StoreServer();  // shuts down

  int port() const { return port_; }

 private:
  class Service;
  StoreServer() = default;

  std::unique_ptr<Service> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

class GrpcStore final : public KvStore {
 public:
  // `target` is host:port. Set and Delete keep trying to reach the server for
  // `connect_timeout`; Get for its own timeout plus a second (the server's answer that the
  // key is still absent must have time to arrive).
  GrpcStore(const std::string& target, absl::Duration connect_timeout);

  absl::Status Set(absl::string_view key, absl::string_view value) override;
  absl::StatusOr<std::string> Get(absl::string_view key, absl::Duration timeout) override;
  absl::Status Delete(absl::string_view key) override;

 private:
  // An error of an RPC to the store, naming the call, the key and the server.
  absl::Status CallError(absl::string_view call, absl::string_view key, absl::Duration waited,
                         const grpc::Status& status) const;

  std::string target_;
  absl::Duration connect_timeout_;
  std::unique_ptr<v1::StoreService::Stub> stub_;
};

}  // namespace prl::collective
