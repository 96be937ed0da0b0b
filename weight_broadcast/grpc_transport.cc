#include "weight_broadcast/grpc_transport.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "core/xxhash_inline.h"
#include "rpc/grpc_util.h"
#include "weight_broadcast/grpc_channel.h"
#include "weight_broadcast/mailbox.h"

namespace prl {

using weight_broadcast_internal::GrpcWeightChannel;
using weight_broadcast_internal::GrpcWeightService;
using weight_broadcast_internal::WeightMailbox;

namespace {
// Keepalive pings find a dead peer on a stream that is idle between versions.
constexpr int kKeepaliveMs = 30'000;
constexpr int kKeepaliveTimeoutMs = 10'000;
}  // namespace

absl::StatusOr<std::unique_ptr<grpc::Server>> weight_broadcast_internal::StartWeightServer(
    GrpcWeightService* service, const GrpcPublisherOptions& options, int* port) {
  if (options.chunk_bytes < 4096 || options.chunk_bytes > (int64_t{256} << 20)) {
    return absl::InvalidArgumentError(
        absl::StrCat("GrpcPublisherOptions.chunk_bytes must be in [4096, 256 MiB], found ",
                     options.chunk_bytes));
  }
  grpc::ServerBuilder builder;
  rpc::ConfigureServerBuilder(builder, options.chunk_bytes + (int64_t{1} << 20));
  // Subscribers ping an idle stream every kKeepaliveMs: allow it. The server pings too, so
  // that a stream to a vanished subscriber (blocked writing into a full window) is dropped.
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS,
                             kKeepaliveMs / 2);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, kKeepaliveMs);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, kKeepaliveTimeoutMs);
  builder.RegisterService(service);
  return rpc::StartServer(builder, options.address, port);
}

absl::StatusOr<std::unique_ptr<GrpcWeightPublisher>> GrpcWeightPublisher::Start(
    const WeightSpec& spec, const GrpcPublisherOptions& options) {
  PRL_RETURN_IF_ERROR(ValidateWeightSpec(spec));
  auto publisher = std::unique_ptr<GrpcWeightPublisher>(new GrpcWeightPublisher());
  publisher->channel_ = std::make_shared<GrpcWeightChannel>(spec, options, options.version_file);
  PRL_RETURN_IF_ERROR(publisher->channel_->LoadHeldVersion());
  publisher->service_ = std::make_unique<GrpcWeightService>();
  publisher->service_->Add("", publisher->channel_);
  PRL_ASSIGN_OR_RETURN(publisher->server_, weight_broadcast_internal::StartWeightServer(
                                               publisher->service_.get(), options,
                                               &publisher->port_));
  return publisher;
}

GrpcWeightPublisher::~GrpcWeightPublisher() { Shutdown(); }

void GrpcWeightPublisher::Shutdown() {
  if (server_ == nullptr) return;
  service_->StopAll();
  // Streams blocked writing to a subscriber that stopped reading are cancelled at the deadline.
  server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  server_.reset();
}

absl::Status GrpcWeightPublisher::PublishWeights(int64_t version, const WeightView& weights) {
  return channel_->Publish(version, weights);
}

PublisherStats GrpcWeightPublisher::stats() const { return channel_->stats(); }

int64_t GrpcWeightPublisher::newest_version() const { return channel_->newest_version(); }

void GrpcWeightPublisher::CorruptNextChunkForTesting() { channel_->CorruptNextChunk(); }

// ---- Subscriber ---------------------------------------------------------------------------

// The version being received on the current stream.
struct GrpcWeightSubscriber::Receiving {
  int64_t version = -1;  // -1: between versions
  uint64_t next_offset = 0;
  weight_broadcast_internal::WeightBuffer dest;
  XXH3_state_t hash;
  absl::Time start;
};

absl::StatusOr<std::unique_ptr<GrpcWeightSubscriber>> GrpcWeightSubscriber::Connect(
    const std::string& target, const WeightSpec& spec, const GrpcSubscriberOptions& options) {
  PRL_RETURN_IF_ERROR(ValidateWeightSpec(spec));
  if (options.initial_backoff <= absl::ZeroDuration() ||
      options.max_backoff < options.initial_backoff) {
    return absl::InvalidArgumentError(
        absl::StrCat("GrpcSubscriberOptions: need 0 < initial_backoff <= max_backoff, found ",
                     absl::FormatDuration(options.initial_backoff), " and ",
                     absl::FormatDuration(options.max_backoff)));
  }
  auto subscriber =
      std::unique_ptr<GrpcWeightSubscriber>(new GrpcWeightSubscriber(target, spec, options));
  grpc::ChannelArguments args = rpc::ChannelArgs(options.max_message_bytes);
  // gRPC's own reconnect backoff (1 s growing to 2 min by default) would make a restarted
  // learner wait: follow ours instead.
  const int initial_ms = static_cast<int>(absl::ToInt64Milliseconds(options.initial_backoff));
  const int max_ms = static_cast<int>(absl::ToInt64Milliseconds(options.max_backoff));
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, std::max(1, initial_ms));
  // (Not GRPC_ARG_MIN_RECONNECT_BACKOFF_MS: gRPC takes it as each connection attempt's timeout,
  // and at 100 ms a loaded host's handshake fails and backs off again.)
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, std::max(1, max_ms));
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, kKeepaliveMs);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, kKeepaliveTimeoutMs);
  // The subscriber never sends data on its stream: keep pinging regardless.
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  subscriber->stub_ = v1::WeightService::NewStub(rpc::NewChannel(target, args));
  subscriber->receiver_ = std::thread([s = subscriber.get()] { s->ReceiveLoop(); });
  return subscriber;
}

GrpcWeightSubscriber::GrpcWeightSubscriber(const std::string& target, const WeightSpec& spec,
                                           const GrpcSubscriberOptions& options)
    : target_(target),
      handshake_(LocalHandshake("grpc", spec)),
      weight_bytes_(static_cast<uint64_t>(handshake_.weight_bytes)),
      options_(options),
      mailbox_(std::make_unique<WeightMailbox>(spec, options.device)) {}

GrpcWeightSubscriber::~GrpcWeightSubscriber() {
  mailbox_->Close();
  {
    std::lock_guard<std::mutex> lock(context_mu_);
    if (context_ != nullptr) context_->TryCancel();
  }
  if (receiver_.joinable()) receiver_.join();
}

void GrpcWeightSubscriber::ReceiveLoop() {
  absl::Duration backoff = options_.initial_backoff;
  while (!mailbox_->closed()) {
    const int64_t had = mailbox_->last_version();
    const absl::Status ended = ReceiveStream();
    if (mailbox_->closed()) return;
    if (ended.code() == absl::StatusCode::kFailedPrecondition ||  // a model mismatch
        ended.code() == absl::StatusCode::kNotFound) {             // a deleted adapter
      mailbox_->Fail(absl::Status(ended.code(),
                                  absl::StrCat("subscribing to ", target_, ": ", ended.message())));
      return;
    }
    mailbox_->NoteReconnect(ended);
    if (mailbox_->last_version() > had) backoff = options_.initial_backoff;
    if (!mailbox_->SleepUnlessClosed(backoff)) return;
    backoff = std::min(backoff * 2, options_.max_backoff);
  }
}

absl::Status GrpcWeightSubscriber::ReceiveStream() {
  grpc::ClientContext context;
  {
    std::lock_guard<std::mutex> lock(context_mu_);
    if (mailbox_->closed()) return absl::CancelledError("closed");
    context_ = &context;
  }
  v1::SubscribeRequest request;
  request.set_have_version(mailbox_->last_version());
  request.set_model_fingerprint(handshake_.model_fingerprint);
  request.set_adapter_id(options_.adapter_id);
  std::unique_ptr<grpc::ClientReader<v1::WeightChunk>> reader = stub_->Subscribe(&context, request);
  Receiving receiving;
  absl::Status broken;
  v1::WeightChunk chunk;
  while (reader->Read(&chunk)) {
    broken = Accept(chunk, &receiving);
    if (!broken.ok()) {
      context.TryCancel();
      break;
    }
  }
  const grpc::Status finished = reader->Finish();
  {
    std::lock_guard<std::mutex> lock(context_mu_);
    context_ = nullptr;
  }
  if (!broken.ok()) return broken;
  if (finished.ok()) return absl::UnavailableError("weight server ended the stream");
  return rpc::FromGrpcStatus(finished);
}

absl::Status GrpcWeightSubscriber::Accept(const v1::WeightChunk& chunk, Receiving* r) {
  const uint64_t total = weight_bytes_;
  if (chunk.offset() == 0) {
    if (chunk.version() <= mailbox_->last_version()) {
      return absl::DataLossError(absl::StrCat("weight server sent version ", chunk.version(),
                                              ", not newer than ", mailbox_->last_version()));
    }
    PRL_ASSIGN_OR_RETURN(ModelConfig published,
                         ParseModelConfig(chunk.config_json(), "the weight server's config.json"));
    WeightHandshake theirs = LocalHandshake("grpc", published);
    if (!chunk.weights_fingerprint().empty()) {
      theirs.model_fingerprint = chunk.weights_fingerprint();
    }
    theirs.weight_bytes = static_cast<int64_t>(chunk.total_bytes());
    PRL_RETURN_IF_ERROR(CheckHandshake(theirs, handshake_, "weight server"));
    PRL_ASSIGN_OR_RETURN(r->dest, mailbox_->AcquireBuffer());
    r->version = chunk.version();
    r->next_offset = 0;
    r->start = absl::Now();
    XXH3_64bits_reset(&r->hash);
  }
  if (chunk.total_bytes() != total) {
    return absl::FailedPreconditionError(
        absl::StrCat("weight server sends versions of ", chunk.total_bytes(),
                     " bytes, this model has ", total, " (a prl with another parameter layout?)"));
  }
  const uint64_t n = chunk.data().size();
  if (r->version != chunk.version() || chunk.offset() != r->next_offset || n == 0 ||
      n > total - r->next_offset) {
    return absl::DataLossError(
        absl::StrCat("weight stream out of order: expected version ", r->version, " at offset ",
                     r->next_offset, ", got version ", chunk.version(), " bytes [", chunk.offset(),
                     ", ", chunk.offset() + n, ") of ", total));
  }
  PRL_RETURN_IF_ERROR(CopyBytes(reinterpret_cast<uint8_t*>(r->dest.data()) + r->next_offset,
                                r->dest.device(), chunk.data().data(), Device::Cpu(), n));
  XXH3_64bits_update(&r->hash, chunk.data().data(), n);
  r->next_offset += n;
  if (r->next_offset < total) return absl::OkStatus();
  const uint64_t checksum = XXH3_64bits_digest(&r->hash);
  const int64_t version = r->version;
  r->version = -1;
  if (checksum != chunk.checksum()) {
    const std::string what = absl::StrCat(
        "weight version ", version, " failed its checksum (XXH3-64 ", absl::Hex(checksum),
        ", server says ", absl::Hex(chunk.checksum()), "): discarded, fetching it again");
    mailbox_->NoteChecksumFailure(what);
    return absl::DataLossError(what);
  }
  mailbox_->Deliver(version, std::move(r->dest), absl::Now() - r->start);
  return absl::OkStatus();
}

absl::StatusOr<std::optional<VersionedWeights>> GrpcWeightSubscriber::TakeNewer(int64_t have) {
  return mailbox_->TakeNewer(have);
}

absl::StatusOr<VersionedWeights> GrpcWeightSubscriber::WaitNewer(int64_t have,
                                                                 absl::Duration timeout) {
  return mailbox_->WaitNewer(have, timeout);
}

SubscriberStats GrpcWeightSubscriber::stats() const { return mailbox_->stats(); }

}  // namespace prl
