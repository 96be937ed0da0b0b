#include "coordinator/coordinator_server.h"

#include <atomic>

#include "core/status_macros.h"
#include "prl/v1/prompt.grpc.pb.h"
#include "rpc/grpc_util.h"

namespace prl::coordinator {

namespace v1 = prl::v1;
using grpc::ServerContext;
using rpc::ToGrpcStatus;

namespace {

// The caller's tenant, from its token (rpc/security.h); none: the operator. A tenant's token
// that no longer names a tenant is an error, never the operator's rights.
absl::StatusOr<Caller> CallerOf(const ServerContext* context) {
  PRL_ASSIGN_OR_RETURN(std::string tenant, rpc::TenantOf(*context));
  return Caller{std::move(tenant)};
}

}  // namespace

// `Caller name` from the call's context, or the call answers the error.
#define PRL_GRPC_ASSIGN_CALLER(name, context)                   \
  absl::StatusOr<Caller> name##_or = CallerOf(context);         \
  if (!name##_or.ok()) return ToGrpcStatus(name##_or.status()); \
  const Caller& name = *name##_or

class CoordinatorServer::Prompts final : public v1::PromptService::Service {
 public:
  Prompts(Coordinator* c, int max_watchers) : c_(c), max_watchers_(max_watchers) {}

  grpc::Status SubmitPromptSet(ServerContext* context, const v1::SubmitPromptSetRequest* request,
                               v1::SubmitPromptSetResponse* response) override {
    return rpc::Guarded("prl.v1.PromptService/SubmitPromptSet", [&]() -> grpc::Status {
      PRL_GRPC_ASSIGN_CALLER(caller, context);
      absl::StatusOr<v1::SubmitPromptSetResponse> r = c_->Submit(*request, caller);
      if (!r.ok()) return ToGrpcStatus(r.status());
      *response = *r;
      return grpc::Status::OK;
    });
  }
  grpc::Status GetPromptSet(ServerContext* context, const v1::GetPromptSetRequest* request,
                            v1::PromptSetStatus* response) override {
    return rpc::Guarded("prl.v1.PromptService/GetPromptSet", [&]() -> grpc::Status {
      PRL_GRPC_ASSIGN_CALLER(caller, context);
      absl::StatusOr<v1::PromptSetStatus> r = c_->Get(request->prompt_set_id(), caller);
      if (!r.ok()) return ToGrpcStatus(r.status());
      *response = *r;
      return grpc::Status::OK;
    });
  }
  grpc::Status ListPromptSets(ServerContext* context, const v1::ListPromptSetsRequest* request,
                              v1::ListPromptSetsResponse* response) override {
    return rpc::Guarded("prl.v1.PromptService/ListPromptSets", [&]() -> grpc::Status {
      PRL_GRPC_ASSIGN_CALLER(caller, context);
      absl::StatusOr<v1::ListPromptSetsResponse> page = c_->ListPage(*request, caller);
      if (!page.ok()) return ToGrpcStatus(page.status());
      *response = std::move(*page);
      return grpc::Status::OK;
    });
  }
  grpc::Status CancelPromptSet(ServerContext* context, const v1::CancelPromptSetRequest* request,
                               v1::PromptSetStatus* response) override {
    return rpc::Guarded("prl.v1.PromptService/CancelPromptSet", [&]() -> grpc::Status {
      PRL_GRPC_ASSIGN_CALLER(caller, context);
      absl::StatusOr<v1::PromptSetStatus> r = c_->Cancel(request->prompt_set_id(), caller);
      if (!r.ok()) return ToGrpcStatus(r.status());
      *response = *r;
      return grpc::Status::OK;
    });
  }
  grpc::Status WatchPromptSet(ServerContext* context, const v1::WatchPromptSetRequest* request,
                              grpc::ServerWriter<v1::PromptSetEvent>* writer) override {
    return rpc::Guarded("prl.v1.PromptService/WatchPromptSet", [&]() -> grpc::Status {
      // Each open stream holds a server thread: at most max_watch_streams at once.
      if (watchers_.fetch_add(1) >= max_watchers_) {
        watchers_.fetch_sub(1);
        return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                            absl::StrCat(max_watchers_,
                                         " watch streams are open (coordinator."
                                         "max_watch_streams): retry later"));
      }
      const grpc::Status status = Watch(context, request, writer);
      watchers_.fetch_sub(1);
      return status;
    });
  }

 private:
  grpc::Status Watch(ServerContext* context, const v1::WatchPromptSetRequest* request,
                     grpc::ServerWriter<v1::PromptSetEvent>* writer) {
    PRL_GRPC_ASSIGN_CALLER(caller, context);
    size_t cursor = 0;
    bool finished = false;
    while (!context->IsCancelled()) {
      absl::StatusOr<std::vector<v1::PromptSetEvent>> events =
          c_->WatchEvents(request->prompt_set_id(), &cursor, absl::Milliseconds(500), &finished,
                          request->include_texts(), caller);
      if (!events.ok()) return ToGrpcStatus(events.status());
      for (const v1::PromptSetEvent& e : *events) {
        if (!writer->Write(e)) return grpc::Status::OK;  // the client went away
      }
      if (finished) return grpc::Status::OK;
    }
    return grpc::Status::CANCELLED;
  }

 public:
  grpc::Status ListAdapters(ServerContext* context, const v1::ListAdaptersRequest*,
                            v1::ListAdaptersResponse* response) override {
    return rpc::Guarded("prl.v1.PromptService/ListAdapters", [&]() -> grpc::Status {
      PRL_GRPC_ASSIGN_CALLER(caller, context);
      *response = c_->ListAdapters(caller);
      return grpc::Status::OK;
    });
  }
  grpc::Status DeleteAdapter(ServerContext* context, const v1::DeleteAdapterRequest* request,
                             v1::DeleteAdapterResponse* response) override {
    return rpc::Guarded("prl.v1.PromptService/DeleteAdapter", [&]() -> grpc::Status {
      PRL_GRPC_ASSIGN_CALLER(caller, context);
      absl::StatusOr<v1::DeleteAdapterResponse> r = c_->DeleteAdapter(request->name(), caller);
      if (!r.ok()) return ToGrpcStatus(r.status());
      *response = *r;
      return grpc::Status::OK;
    });
  }

 private:
  Coordinator* c_;
  const int max_watchers_;
  std::atomic<int> watchers_{0};
};

// The hot pair, LeasePrompts and Complete, use gRPC's callback API: a lease is answered on the
// thread that read it, and a completion is answered by the prompt log's flusher once its group
// commit is durable, so that no thread per call waits for an fsync (prl bench coordinator).
// The other methods are rare and may block (a heartbeat that drops leases waits for the log):
// they keep the synchronous API and its thread pool.
using ActorControlBase = v1::ActorControl::WithCallbackMethod_LeasePrompts<
    v1::ActorControl::WithCallbackMethod_Complete<v1::ActorControl::Service>>;

class CoordinatorServer::Actors final : public ActorControlBase {
 public:
  explicit Actors(Coordinator* c) : c_(c) {}

  grpc::ServerUnaryReactor* LeasePrompts(grpc::CallbackServerContext* context,
                                         const v1::LeaseRequest* request,
                                         v1::LeaseResponse* response) override {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    reactor->Finish(rpc::Guarded("prl.v1.ActorControl/LeasePrompts",
                                 [&] { return Reply(c_->Lease(*request), response); }));
    return reactor;
  }
  grpc::ServerUnaryReactor* Complete(grpc::CallbackServerContext* context,
                                     const v1::CompleteRequest* request,
                                     v1::CompleteResponse* response) override {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    // Finished by the callback once the completion is durable; a throw before it was taken
    // finishes the call here.
    const grpc::Status started = rpc::Guarded("prl.v1.ActorControl/Complete", [&] {
      c_->CompleteAsync(*request, [reactor, response](absl::StatusOr<v1::CompleteResponse> r) {
        reactor->Finish(Reply(std::move(r), response));
      });
      return grpc::Status::OK;
    });
    if (!started.ok()) reactor->Finish(started);
    return reactor;
  }

  grpc::Status Register(ServerContext*, const v1::RegisterRequest* request,
                        v1::RegisterResponse* response) override {
    return rpc::Guarded("prl.v1.ActorControl/Register", [&]() -> grpc::Status {
      return Reply(c_->RegisterActor(request->actor_name(), request->capacity()), response);
    });
  }
  grpc::Status Heartbeat(ServerContext*, const v1::HeartbeatRequest* request,
                         v1::HeartbeatResponse* response) override {
    return rpc::Guarded("prl.v1.ActorControl/Heartbeat",
                        [&]() -> grpc::Status { return Reply(c_->Heartbeat(*request), response); });
  }
  grpc::Status Release(ServerContext*, const v1::ReleaseRequest* request,
                       v1::ReleaseResponse* response) override {
    return rpc::Guarded("prl.v1.ActorControl/Release",
                        [&]() -> grpc::Status { return Reply(c_->Release(*request), response); });
  }
  grpc::Status ReportLearnerProgress(ServerContext*, const v1::LearnerProgressRequest* request,
                                     v1::LearnerProgressResponse* response) override {
    return rpc::Guarded("prl.v1.ActorControl/ReportLearnerProgress", [&]() -> grpc::Status {
      return Reply(c_->LearnerProgress(*request), response);
    });
  }
  grpc::Status CheckGroup(ServerContext*, const v1::CheckGroupRequest* request,
                          v1::CheckGroupResponse*) override {
    return rpc::Guarded("prl.v1.ActorControl/CheckGroup",
                        [&]() -> grpc::Status { return ToGrpcStatus(c_->CheckGroup(*request)); });
  }
  grpc::Status ReopenPrompts(ServerContext*, const v1::ReopenPromptsRequest* request,
                             v1::ReopenPromptsResponse* response) override {
    return rpc::Guarded("prl.v1.ActorControl/ReopenPrompts",
                        [&]() -> grpc::Status { return Reply(c_->Reopen(*request), response); });
  }

 private:
  template <typename T>
  static grpc::Status Reply(absl::StatusOr<T> r, T* response) {
    if (!r.ok()) return ToGrpcStatus(r.status());
    *response = std::move(*r);
    return grpc::Status::OK;
  }
  Coordinator* c_;
};

absl::StatusOr<std::unique_ptr<CoordinatorServer>> CoordinatorServer::Start(
    Coordinator* coordinator, const std::string& address, int max_watch_streams) {
  std::unique_ptr<CoordinatorServer> s(new CoordinatorServer());
  s->coordinator_ = coordinator;
  s->prompts_ = std::make_unique<Prompts>(coordinator, max_watch_streams);
  s->actors_ = std::make_unique<Actors>(coordinator);
  grpc::ServerBuilder builder;
  rpc::ConfigureServerBuilder(builder, int64_t{256} << 20);
  builder.RegisterService(s->prompts_.get());
  builder.RegisterService(s->actors_.get());
  PRL_ASSIGN_OR_RETURN(s->server_, rpc::StartServer(builder, address, &s->port_));
  CoordinatorServer* raw = s.get();
  s->expirer_ = std::thread([raw] {
    while (!raw->stopping_.load()) {
      raw->coordinator_->ExpireLeases();
      for (int i = 0; i < 10 && !raw->stopping_.load(); ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
    }
  });
  return s;
}

void CoordinatorServer::Shutdown() {
  if (stopping_.exchange(true) || server_ == nullptr) return;  // stopped, or never started
  server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  if (expirer_.joinable()) expirer_.join();
}

CoordinatorServer::~CoordinatorServer() { Shutdown(); }

}  // namespace prl::coordinator
