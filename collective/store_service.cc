#include "collective/store_service.h"

#include <algorithm>
#include <atomic>
#include <chrono>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "rpc/grpc_util.h"

namespace prl::collective {

namespace {

// Rendezvous values are a few KB; a store is no place for tensors.
constexpr int64_t kMaxMessageBytes = int64_t{64} << 20;
// A waiting Get checks for cancellation and shutdown this often.
constexpr absl::Duration kWaitSlice = absl::Milliseconds(100);
// How much longer than the server's wait a client waits for a Get's answer.
constexpr absl::Duration kGetGrace = absl::Seconds(1);

std::chrono::system_clock::time_point ClientDeadline(absl::Duration timeout) {
  timeout = std::clamp(timeout, absl::ZeroDuration(), absl::Hours(24 * 365));
  return std::chrono::system_clock::now() +
         std::chrono::duration_cast<std::chrono::system_clock::duration>(
             absl::ToChronoNanoseconds(timeout));
}

}  // namespace

// ---- Server --------------------------------------------------------------------------------

class StoreServer::Service final : public v1::StoreService::Service {
 public:
  explicit Service(MemoryStore* store) : store_(store) {}

  void BeginShutdown() { shutting_down_ = true; }

  grpc::Status Set(grpc::ServerContext*, const v1::StoreSetRequest* request,
                   v1::StoreSetResponse*) override {
    return rpc::Guarded("prl.v1.StoreService/Set", [&]() -> grpc::Status {
      return rpc::ToGrpcStatus(store_->Set(request->key(), request->value()));
    });
  }

  grpc::Status Get(grpc::ServerContext* context, const v1::StoreGetRequest* request,
                   v1::StoreGetResponse* response) override {
    return rpc::Guarded("prl.v1.StoreService/Get", [&]() -> grpc::Status {
      const absl::Duration timeout =
          absl::Milliseconds(std::max<int64_t>(request->timeout_ms(), 0));
      const absl::Time deadline = absl::Now() + timeout;
      while (true) {
        if (shutting_down_) {
          return grpc::Status(grpc::StatusCode::UNAVAILABLE, "the store server is shutting down");
        }
        if (context->IsCancelled()) return grpc::Status(grpc::StatusCode::CANCELLED, "cancelled");
        const absl::Duration slice =
            std::clamp(deadline - absl::Now(), absl::ZeroDuration(), kWaitSlice);
        absl::StatusOr<std::string> value = store_->Get(request->key(), slice);
        if (value.ok()) {
          response->set_value(*std::move(value));
          return grpc::Status::OK;
        }
        if (!absl::IsDeadlineExceeded(value.status())) return rpc::ToGrpcStatus(value.status());
        if (absl::Now() >= deadline) {
          return rpc::ToGrpcStatus(GetTimedOut(request->key(), timeout, "store server"));
        }
      }
    });
  }

  grpc::Status Delete(grpc::ServerContext*, const v1::StoreDeleteRequest* request,
                      v1::StoreDeleteResponse*) override {
    return rpc::Guarded("prl.v1.StoreService/Delete", [&]() -> grpc::Status {
      return rpc::ToGrpcStatus(store_->Delete(request->key()));
    });
  }

 private:
  MemoryStore* store_;
  std::atomic<bool> shutting_down_{false};
};

absl::StatusOr<std::unique_ptr<StoreServer>> StoreServer::Start(MemoryStore* store,
                                                                const std::string& address,
                                                                const rpc::AccessPolicy& policy) {
  auto server = std::unique_ptr<StoreServer>(new StoreServer());
  server->service_ = std::make_unique<Service>(store);
  grpc::ServerBuilder builder;
  rpc::ConfigureServerBuilder(builder, kMaxMessageBytes);
  builder.RegisterService(server->service_.get());
  PRL_ASSIGN_OR_RETURN(server->server_, rpc::StartServer(builder, address, &server->port_, policy));
  return server;
}

StoreServer::~StoreServer() {
  if (server_ == nullptr) return;
  service_->BeginShutdown();  // waiting Gets return within one slice
  server_->Shutdown(ClientDeadline(absl::Seconds(1)));
  server_->Wait();
}

// ---- Client --------------------------------------------------------------------------------

GrpcStore::GrpcStore(const std::string& target, absl::Duration connect_timeout)
    : target_(target), connect_timeout_(connect_timeout) {
  grpc::ChannelArguments args = rpc::ChannelArgs(kMaxMessageBytes);
  // A rank that starts before rank 0 retries every 100 ms to 1 s, not gRPC's default of up to
  // two minutes, so it connects soon after the server is up.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  // (Not GRPC_ARG_MIN_RECONNECT_BACKOFF_MS: gRPC takes it as each connection attempt's timeout,
  // and at 100 ms a loaded host's handshake fails and backs off again.)
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  stub_ = v1::StoreService::NewStub(rpc::NewChannel(target, args));
}

absl::Status GrpcStore::CallError(absl::string_view call, absl::string_view key,
                                  absl::Duration waited, const grpc::Status& status) const {
  const std::string where = absl::StrCat("store server ", target_);
  if (status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
    if (call == "get") return GetTimedOut(key, waited, where);
    return absl::DeadlineExceededError(absl::StrCat(
        "kv store ", call, " '", key, "': ", where, " did not answer within ",
        SecondsString(waited), " (is rank 0 running, and are MASTER_ADDR:MASTER_PORT right?)"));
  }
  const absl::Status s = rpc::FromGrpcStatus(status);
  return absl::Status(
      s.code(), absl::StrCat("kv store ", call, " '", key, "' at ", where, ": ", s.message()));
}

absl::Status GrpcStore::Set(absl::string_view key, absl::string_view value) {
  v1::StoreSetRequest request;
  request.set_key(std::string(key));
  request.set_value(std::string(value));
  v1::StoreSetResponse response;
  grpc::ClientContext context;
  context.set_wait_for_ready(true);  // the server may not be up yet
  context.set_deadline(ClientDeadline(connect_timeout_));
  const grpc::Status status = stub_->Set(&context, request, &response);
  if (!status.ok()) return CallError("set", key, connect_timeout_, status);
  return absl::OkStatus();
}

absl::StatusOr<std::string> GrpcStore::Get(absl::string_view key, absl::Duration timeout) {
  timeout = std::clamp(timeout, absl::ZeroDuration(), absl::Hours(24 * 365));
  v1::StoreGetRequest request;
  request.set_key(std::string(key));
  request.set_timeout_ms(absl::ToInt64Milliseconds(timeout));
  v1::StoreGetResponse response;
  grpc::ClientContext context;
  context.set_wait_for_ready(true);
  // The server answers DEADLINE_EXCEEDED itself after timeout_ms; the client deadline, a
  // little later so that the answer can arrive, covers a server that never comes up.
  context.set_deadline(ClientDeadline(timeout + kGetGrace));
  const grpc::Status status = stub_->Get(&context, request, &response);
  if (!status.ok()) {
    const bool server_waited = status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED &&
                               absl::StartsWith(status.error_message(), "kv store get");
    return CallError("get", key, server_waited ? timeout : timeout + kGetGrace, status);
  }
  return std::move(*response.mutable_value());
}

absl::Status GrpcStore::Delete(absl::string_view key) {
  v1::StoreDeleteRequest request;
  request.set_key(std::string(key));
  v1::StoreDeleteResponse response;
  grpc::ClientContext context;
  context.set_wait_for_ready(true);
  context.set_deadline(ClientDeadline(connect_timeout_));
  const grpc::Status status = stub_->Delete(&context, request, &response);
  if (!status.ok()) return CallError("delete", key, connect_timeout_, status);
  return absl::OkStatus();
}

}  // namespace prl::collective
