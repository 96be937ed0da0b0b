// What every prl gRPC server and client shares: absl::Status <-> grpc::Status, and a server
// builder set up the prl way (health checking and reflection on, message limits raised, the
// process's security: rpc/security.h).
#pragma once

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "rpc/security.h"

namespace prl::rpc {

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

// Every prl service method's body runs inside Guarded: an exception it throws becomes INTERNAL
// "internal error (call N of <method>): the server's log has the details", and the method, the
// call's number N and the exception's text go to stderr; no call takes a server down. (gRPC's
// own catch would answer UNKNOWN and log nothing; a callback reactor's would not catch at all.)
// `method` is "prl.v1.<Service>/<Method>"; core/test_hooks.h's ThrowPoint(method) runs first.
grpc::Status Guarded(const char* method, const std::function<grpc::Status()>& handler);

// The most threads one server runs calls on, and the most it keeps waiting for calls.
inline constexpr int kMaxServerThreads = 256;
inline constexpr int kMaxIdleServerThreads = 64;

// Enables the standard health service (grpc.health.v1) and server reflection for the servers
// built after this call, raises the message limits to max_message_bytes and bounds the server's
// threads (kMaxServerThreads, of which up to kMaxIdleServerThreads wait for the next call).
void ConfigureServerBuilder(grpc::ServerBuilder& builder, int64_t max_message_bytes);

// Channel arguments for clients that send or receive messages up to max_message_bytes.
grpc::ChannelArguments ChannelArgs(int64_t max_message_bytes);

// Builds and starts a server listening on `address` (host:port; port 0 picks a free one) with
// this process's security (rpc/security.h: TLS or loopback plaintext, bearer tokens admitted by
// `policy`). *bound_port receives the port actually bound. A port another process listens on is
// AlreadyExists naming the port (no SO_REUSEPORT: two servers never share one); callers prefix
// the config key.
absl::StatusOr<std::unique_ptr<grpc::Server>> StartServer(
    grpc::ServerBuilder& builder, const std::string& address, int* bound_port,
    const AccessPolicy& policy = DefaultAccessPolicy());

}  // namespace prl::rpc
