#include "rpc/grpc_util.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>

#include <atomic>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "core/net_address.h"
#include "core/test_hooks.h"

namespace prl::rpc {

grpc::Status Guarded(const char* method, const std::function<grpc::Status()>& handler) {
  static std::atomic<int64_t> calls{0};
  std::string what;
  try {
    ThrowPoint(method);
    return handler();
  } catch (const std::exception& e) {
    what = e.what();
  } catch (...) {
    what = "an exception of unknown type";
  }
  const int64_t call = ++calls;
  std::fprintf(stderr, "%s: call %lld: internal error: %s\n", method, static_cast<long long>(call),
               what.c_str());
  return grpc::Status(grpc::StatusCode::INTERNAL,
                      absl::StrCat("internal error (call ", call, " of ", method,
                                   "): the server's log has the details"));
}

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  // absl and gRPC share the canonical status codes.
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

void ConfigureServerBuilder(grpc::ServerBuilder& builder, int64_t max_message_bytes) {
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  const int limit = static_cast<int>(std::min<int64_t>(max_message_bytes, INT32_MAX));
  builder.SetMaxReceiveMessageSize(limit);
  builder.SetMaxSendMessageSize(limit);
  // Every call (and every open stream) holds a thread of the server's pool: bounded, so a flood
  // of calls queues instead of exhausting the process.
  grpc::ResourceQuota quota("prl-server");
  quota.SetMaxThreads(kMaxServerThreads);
  builder.SetResourceQuota(quota);
  // A thread whose call ended stays, polling for the next, while fewer than kMaxIdleServerThreads
  // do (gRPC's default keeps 2): synchronous calls that block in their handler in bursts then
  // reuse threads instead of creating and ending one per call. (Measured when the coordinator's
  // Complete still waited for its fsync in a synchronous handler: +25-40% completions/s on 2
  // cores; its hot calls use the callback API now.)
  builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::MAX_POLLERS,
                              kMaxIdleServerThreads);
  // gRPC binds with SO_REUSEPORT by default on Linux: a second server on a port in use would
  // start too, and the kernel would split the connections between them (two runs on one
  // machine cross-wired). One listener per port: a port in use is an error.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
}

grpc::ChannelArguments ChannelArgs(int64_t max_message_bytes) {
  grpc::ChannelArguments args;
  const int limit = static_cast<int>(std::min<int64_t>(max_message_bytes, INT32_MAX));
  args.SetMaxSendMessageSize(limit);
  args.SetMaxReceiveMessageSize(limit);
  return args;
}

absl::StatusOr<std::unique_ptr<grpc::Server>> StartServer(grpc::ServerBuilder& builder,
                                                          const std::string& address,
                                                          int* bound_port,
                                                          const AccessPolicy& policy) {
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials =
      ServerCredentialsFor(address, policy);
  if (!credentials.ok()) return credentials.status();
  builder.AddListeningPort(address, *credentials, bound_port);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || *bound_port == 0) {
    if (PortInUse(address)) {
      return absl::AlreadyExistsError(absl::StrCat(
          "cannot listen on ", address, ": port ", address.substr(address.rfind(':') + 1),
          " is in use (another process listens there: a second run on this machine needs "
          "other ports, or port 0 for a free one)"));
    }
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", address, " (not a valid host:port on this machine)"));
  }
  return server;
}

}  // namespace prl::rpc
