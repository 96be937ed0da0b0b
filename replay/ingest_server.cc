#include "replay/ingest_server.h"

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "replay/record_proto.h"
#include "rpc/grpc_util.h"

namespace prl {

namespace {
constexpr char kGroupsAcceptedKey[] = "prl-groups-accepted";
constexpr char kRecordsAcceptedKey[] = "prl-records-accepted";

uint64_t TrailerCount(const grpc::ClientContext& context, const char* key) {
  const auto& trailers = context.GetServerTrailingMetadata();
  auto it = trailers.find(key);
  return it == trailers.end() ? 0 : std::stoull(std::string(it->second.data(), it->second.size()));
}
}  // namespace

class ReplayIngestServer::Service final : public v1::ReplayService::Service {
 public:
  Service(ReplayBuffer* buffer, const IngestOptions& options)
      : buffer_(buffer),
        write_timeout_(options.write_timeout),
        learner_version_(options.learner_version),
        admit_(options.admit),
        adapter_buffer_(options.adapter_buffer),
        on_written_(options.on_written),
        quarantine_(options.model, options.dead_letter_path, "ingest") {}

  QuarantineCounts dead_letters() const { return quarantine_.counts(); }

  grpc::Status Push(grpc::ServerContext* context, grpc::ServerReader<v1::PushRequest>* reader,
                    v1::PushResponse* response) override {
    return rpc::Guarded("prl.v1.ReplayService/Push", [&]() -> grpc::Status {
      // gRPC sends no response message with an error status: the counts also travel in the
      // trailing metadata, so a client knows what was accepted before the error.
      struct Trailer {
        grpc::ServerContext* context;
        v1::PushResponse* response;
        ~Trailer() {
          context->AddTrailingMetadata(kGroupsAcceptedKey,
                                       absl::StrCat(response->groups_accepted()));
          context->AddTrailingMetadata(kRecordsAcceptedKey,
                                       absl::StrCat(response->records_accepted()));
        }
      } trailer{context, response};
      v1::PushRequest request;
      for (uint64_t message = 0; reader->Read(&request); ++message) {
        std::vector<RolloutRecord> group;
        group.reserve(request.group_size());
        for (int i = 0; i < request.group_size(); ++i) {
          absl::StatusOr<RolloutRecord> record = FromProto(request.group(i));
          if (!record.ok()) {
            const absl::Status refused = quarantine_.Refuse(
                group,
                GroupProblem{DeadLetterReason::kMalformed, absl::StrCat("records[", i, "]"),
                             "a valid rollout record", std::string(record.status().message())});
            return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                absl::StrCat("push message ", message, ": ", refused.message()));
          }
          group.push_back(std::move(record).value());
        }
        if (admit_) {
          const absl::Status admitted = admit_(group, request.adapter_id());
          if (!admitted.ok()) {
            return rpc::ToGrpcStatus(absl::Status(
                admitted.code(), absl::StrCat("push message ", message, ": ", admitted.message())));
          }
        }
        // Quarantine (replay/quarantine.h): checked against the model before it is written.
        const int64_t version = learner_version_ ? learner_version_() : INT64_MAX;
        if (const absl::Status checked = quarantine_.Check(group, version); !checked.ok()) {
          return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                              absl::StrCat("push message ", message, ": ", checked.message()));
        }
        absl::StatusOr<std::shared_ptr<ReplayBuffer>> buffer = BufferOf(request.adapter_id());
        if (!buffer.ok()) {
          return rpc::ToGrpcStatus(absl::Status(
              buffer.status().code(),
              absl::StrCat("push message ", message, ": ", buffer.status().message())));
        }
        const absl::Status written = (*buffer)->WriteGroup(group, write_timeout_);
        if (!written.ok()) {
          return rpc::ToGrpcStatus(absl::Status(
              written.code(), absl::StrCat("push message ", message, ": ", written.message())));
        }
        if (on_written_) on_written_(group.size());
        response->set_groups_accepted(response->groups_accepted() + 1);
        response->set_records_accepted(response->records_accepted() + group.size());
      }
      return grpc::Status::OK;
    });
  }

 private:
  // The buffer a push's adapter_id names (the run's is not owned: a no-op deleter).
  absl::StatusOr<std::shared_ptr<ReplayBuffer>> BufferOf(const std::string& adapter_id) {
    if (adapter_id.empty()) {
      if (buffer_ != nullptr) return std::shared_ptr<ReplayBuffer>(buffer_, [](ReplayBuffer*) {});
      return absl::InvalidArgumentError(
          "adapter_id: expected the id of the adapter the group trains (a run of adapters), "
          "found none");
    }
    if (!adapter_buffer_) {
      return absl::InvalidArgumentError(
          absl::StrCat("adapter_id: expected none (this replay serves a run of one model), found '",
                       adapter_id.substr(0, 64), "'"));
    }
    return adapter_buffer_(adapter_id);
  }

  ReplayBuffer* buffer_;
  absl::Duration write_timeout_;
  std::function<int64_t()> learner_version_;
  std::function<absl::Status(absl::Span<const RolloutRecord>, const std::string&)> admit_;
  std::function<absl::StatusOr<std::shared_ptr<ReplayBuffer>>(const std::string&)> adapter_buffer_;
  std::function<void(size_t)> on_written_;
  Quarantine quarantine_;
};

absl::StatusOr<std::unique_ptr<ReplayIngestServer>> ReplayIngestServer::Start(
    ReplayBuffer* buffer, const IngestOptions& options) {
  if (buffer == nullptr && !options.adapter_buffer) {
    return absl::InvalidArgumentError("ReplayIngestServer: no buffer to serve");
  }
  auto server = std::unique_ptr<ReplayIngestServer>(new ReplayIngestServer());
  server->service_ = std::make_unique<Service>(buffer, options);
  grpc::ServerBuilder builder;
  rpc::ConfigureServerBuilder(builder, options.max_message_bytes);
  builder.RegisterService(server->service_.get());
  PRL_ASSIGN_OR_RETURN(server->server_, rpc::StartServer(builder, options.address, &server->port_));
  return server;
}

ReplayIngestServer::~ReplayIngestServer() { Shutdown(); }

void ReplayIngestServer::Shutdown() {
  if (server_ != nullptr) server_->Shutdown();
}

void ReplayIngestServer::Wait() {
  if (server_ != nullptr) server_->Wait();
}

QuarantineCounts ReplayIngestServer::dead_letters() const { return service_->dead_letters(); }

absl::StatusOr<std::unique_ptr<ReplayPushClient>> ReplayPushClient::Connect(
    const std::string& target, int64_t max_message_bytes) {
  auto client = std::unique_ptr<ReplayPushClient>(new ReplayPushClient());
  client->stub_ =
      v1::ReplayService::NewStub(rpc::NewChannel(target, rpc::ChannelArgs(max_message_bytes)));
  return client;
}

absl::Status ReplayPushClient::Push(const std::vector<std::vector<RolloutRecord>>& groups,
                                    PushResult* result, absl::Duration deadline,
                                    const std::string& adapter_id) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + absl::ToChronoNanoseconds(deadline));
  v1::PushResponse response;
  std::unique_ptr<grpc::ClientWriter<v1::PushRequest>> writer = stub_->Push(&context, &response);
  for (const std::vector<RolloutRecord>& group : groups) {
    v1::PushRequest request;
    request.set_adapter_id(adapter_id);
    for (const RolloutRecord& r : group) ToProto(r, request.add_group());
    if (!writer->Write(request)) break;  // the server ended the stream: Finish says why
  }
  writer->WritesDone();
  const grpc::Status status = writer->Finish();
  result->groups_accepted = TrailerCount(context, kGroupsAcceptedKey);
  result->records_accepted = TrailerCount(context, kRecordsAcceptedKey);
  return rpc::FromGrpcStatus(status);
}

}  // namespace prl
