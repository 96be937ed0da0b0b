#include "weight_broadcast/grpc_transport.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <map>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "core/xxhash_inline.h"
#include "rpc/grpc_util.h"
#include "weight_broadcast/mailbox.h"
#include "weight_broadcast/version_file.h"
#include "weight_broadcast/versioning.h"

namespace prl {

using weight_broadcast_internal::WeightMailbox;

namespace {
// How often waiting server streams look for a cancelled client or a shutdown.
constexpr auto kServerPoll = std::chrono::milliseconds(100);
// Keepalive pings find a dead peer on a stream that is idle between versions.
constexpr int kKeepaliveMs = 30'000;
constexpr int kKeepaliveTimeoutMs = 10'000;
}  // namespace

// One published version, shared read-only by every stream that sends it.
struct GrpcWeightPublisher::Snapshot {
  int64_t version = 0;
  int64_t index = 0;  // 1 for the first Publish, 2 for the next, ...
  Buffer bytes;       // CPU copy of the fp32 buffer
  uint64_t checksum = 0;
};

class GrpcWeightPublisher::Service final : public v1::WeightService::Service {
 public:
  Service(const WeightSpec& spec, const GrpcPublisherOptions& options)
      : handshake_(LocalHandshake("grpc", spec)),
        config_json_(ModelConfigToJson(spec.model)),
        weight_bytes_(handshake_.weight_bytes),
        chunk_bytes_(options.chunk_bytes),
        stall_timeout_(options.stall_timeout),
        version_file_(options.version_file) {
    stats_.version_bytes = weight_bytes_;
  }

  // What an earlier publisher of the run made visible (its version file).
  absl::Status LoadHeldVersion() {
    if (version_file_.empty()) return absl::OkStatus();
    PRL_ASSIGN_OR_RETURN(const int64_t held, ReadPublishedVersion(version_file_));
    if (held >= 0) versions_.Held(held);
    return absl::OkStatus();
  }

  grpc::Status Subscribe(grpc::ServerContext* context, const v1::SubscribeRequest* request,
                         grpc::ServerWriter<v1::WeightChunk>* writer) override {
    return rpc::Guarded("prl.v1.WeightService/Subscribe", [&]() -> grpc::Status {
      // The request carries only the subscriber's fingerprint; the rest of its side is checked by
      // the subscriber against the first chunk.
      WeightHandshake theirs = handshake_;
      theirs.model_fingerprint = request->model_fingerprint();
      const absl::Status same = CheckHandshake(handshake_, theirs, "weight server");
      if (!same.ok()) return rpc::ToGrpcStatus(same);
      versions_.Reported(request->have_version());
      AddSubscribers(1);
      const absl::Cleanup disconnected = [this] { AddSubscribers(-1); };
      int64_t have = request->have_version();
      int64_t last_index = -1;
      for (;;) {
        std::shared_ptr<const Snapshot> next = WaitNewer(have, context);
        if (next == nullptr) return EndOfStream();
        Sending(context, next->index);
        const bool sent = Send(*next, context, writer);
        Sending(context, -1);
        if (!sent) return EndOfStream();
        std::lock_guard<std::mutex> lock(mu_);
        stats_.versions_sent += 1;
        stats_.bytes_sent += weight_bytes_;
        if (last_index >= 0) stats_.versions_skipped += next->index - last_index - 1;
        last_index = next->index;
        have = next->version;
      }
    });
  }

  absl::Status Publish(int64_t version, const WeightView& weights) {
    const absl::Time start = absl::Now();
    constexpr absl::string_view kWhere = "Publish to the weight server";
    PRL_RETURN_IF_ERROR(versions_.CheckNext(version, kWhere));
    PRL_RETURN_IF_ERROR(CheckPublishedWeights(handshake_, weights, kWhere));
    if (!version_file_.empty()) {  // durable before any subscriber can see it
      PRL_RETURN_IF_ERROR(WritePublishedVersion(version_file_, version));
    }
    const auto bytes = static_cast<size_t>(weight_bytes_);
    std::shared_ptr<Snapshot> snapshot;
    {
      std::lock_guard<std::mutex> lock(mu_);
      // Reuse the previous snapshot's memory once no stream is sending it any more (only the
      // newest is ever handed to a stream, so nobody can take a new reference).
      if (retired_ != nullptr && retired_.use_count() == 1) {
        std::atomic_thread_fence(std::memory_order_acquire);  // after the last stream's reads
        snapshot = std::move(retired_);
      }
    }
    if (snapshot == nullptr) {
      snapshot = std::make_shared<Snapshot>();
      PRL_ASSIGN_OR_RETURN(snapshot->bytes, Buffer::Allocate(Device::Cpu(), bytes));
    }
    PRL_RETURN_IF_ERROR(
        CopyBytes(snapshot->bytes.data(), Device::Cpu(), weights.data, weights.device, bytes));
    snapshot->version = version;
    snapshot->checksum = XXH3_64bits(snapshot->bytes.data(), bytes);

    versions_.Published(version);
    std::lock_guard<std::mutex> lock(mu_);
    snapshot->index = ++published_;
    retired_ = std::move(latest_);
    latest_ = std::move(snapshot);
    CutStalledStreamsLocked();
    stats_.versions_published += 1;
    stats_.last_version = version;
    stats_.last_publish_seconds = absl::ToDoubleSeconds(absl::Now() - start);
    stats_.total_publish_seconds += stats_.last_publish_seconds;
    changed_.notify_all();
    return absl::OkStatus();
  }

  void Stop() {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    changed_.notify_all();
  }

  PublisherStats stats() const {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
  }

  int64_t newest_version() const { return versions_.newest(); }

  void CorruptNextChunk() { corrupt_next_.store(true); }

 private:
  void AddSubscribers(int64_t delta) {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.subscribers += delta;
  }

  // Records which snapshot (by index; -1: none) a stream is sending since when.
  void Sending(grpc::ServerContext* context, int64_t index) {
    std::lock_guard<std::mutex> lock(mu_);
    if (index < 0) {
      sending_.erase(context);
    } else {
      sending_[context] = Transfer{index, absl::Now()};
    }
  }

  // Cancels the streams that have been sending a snapshot older than the previous one for
  // longer than stall_timeout_: only they can pin a snapshot that is neither latest_ nor
  // retired_.
  void CutStalledStreamsLocked() {
    const absl::Time now = absl::Now();
    for (auto& [context, transfer] : sending_) {
      if (transfer.index < published_ - 1 && now - transfer.since > stall_timeout_ &&
          !transfer.cut) {
        context->TryCancel();
        transfer.cut = true;
        stats_.stalled_streams_cut += 1;
      }
    }
  }

  // Why a stream ends early: the server stops (the subscriber reconnects), or the subscriber
  // cancelled (nobody reads the status).
  grpc::Status EndOfStream() {
    if (stopping()) {
      return grpc::Status(grpc::StatusCode::UNAVAILABLE, "weight publisher shutting down");
    }
    return grpc::Status(grpc::StatusCode::CANCELLED, "subscriber cancelled");
  }

  // The newest snapshot newer than `have`; nullptr on shutdown or when the client is gone.
  std::shared_ptr<const Snapshot> WaitNewer(int64_t have, grpc::ServerContext* context) {
    std::unique_lock<std::mutex> lock(mu_);
    while (!stopping_ && !context->IsCancelled()) {
      if (latest_ != nullptr && latest_->version > have) return latest_;
      changed_.wait_for(lock, kServerPoll);
    }
    return nullptr;
  }

  bool Send(const Snapshot& s, grpc::ServerContext* context,
            grpc::ServerWriter<v1::WeightChunk>* writer) {
    const auto* data = static_cast<const char*>(s.bytes.data());
    const int64_t total = weight_bytes_;
    v1::WeightChunk chunk;
    for (int64_t offset = 0; offset < total; offset += chunk_bytes_) {
      if (stopping() || context->IsCancelled()) return false;
      const int64_t n = std::min(chunk_bytes_, total - offset);
      chunk.Clear();
      chunk.set_version(s.version);
      chunk.set_offset(static_cast<uint64_t>(offset));
      chunk.set_total_bytes(static_cast<uint64_t>(total));
      chunk.set_data(data + offset, static_cast<size_t>(n));
      if (offset == 0) {
        chunk.set_config_json(config_json_);
        chunk.set_weights_fingerprint(handshake_.model_fingerprint);
      }
      if (offset + n == total) chunk.set_checksum(s.checksum);
      if (corrupt_next_.exchange(false)) (*chunk.mutable_data())[n / 2] ^= 0x5a;
      if (!writer->Write(chunk)) return false;
    }
    return true;
  }

  bool stopping() {
    std::lock_guard<std::mutex> lock(mu_);
    return stopping_;
  }

  const WeightHandshake handshake_;
  const std::string config_json_;
  const int64_t weight_bytes_;
  const int64_t chunk_bytes_;
  const absl::Duration stall_timeout_;
  const std::string version_file_;
  std::atomic<bool> corrupt_next_{false};
  VersionSequence versions_;  // published, and reported by subscribers (their have_version)
  mutable std::mutex mu_;
  std::condition_variable changed_;  // a new snapshot, or stopping
  std::shared_ptr<Snapshot> latest_;
  std::shared_ptr<Snapshot> retired_;  // the previous latest_, kept for its memory
  struct Transfer {
    int64_t index = 0;  // the snapshot's
    absl::Time since;
    bool cut = false;
  };
  std::map<grpc::ServerContext*, Transfer> sending_;  // streams sending now
  int64_t published_ = 0;
  bool stopping_ = false;
  PublisherStats stats_;
};

absl::StatusOr<std::unique_ptr<GrpcWeightPublisher>> GrpcWeightPublisher::Start(
    const WeightSpec& spec, const GrpcPublisherOptions& options) {
  PRL_RETURN_IF_ERROR(ValidateWeightSpec(spec));
  if (options.chunk_bytes < 4096 || options.chunk_bytes > (int64_t{256} << 20)) {
    return absl::InvalidArgumentError(
        absl::StrCat("GrpcPublisherOptions.chunk_bytes must be in [4096, 256 MiB], found ",
                     options.chunk_bytes));
  }
  auto publisher = std::unique_ptr<GrpcWeightPublisher>(new GrpcWeightPublisher());
  publisher->service_ = std::make_unique<Service>(spec, options);
  PRL_RETURN_IF_ERROR(publisher->service_->LoadHeldVersion());
  grpc::ServerBuilder builder;
  rpc::ConfigureServerBuilder(builder, options.chunk_bytes + (int64_t{1} << 20));
  // Subscribers ping an idle stream every kKeepaliveMs: allow it. The server pings too, so
  // that a stream to a vanished subscriber (blocked writing into a full window) is dropped.
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS,
                             kKeepaliveMs / 2);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, kKeepaliveMs);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, kKeepaliveTimeoutMs);
  builder.RegisterService(publisher->service_.get());
  PRL_ASSIGN_OR_RETURN(publisher->server_,
                       rpc::StartServer(builder, options.address, &publisher->port_));
  return publisher;
}

GrpcWeightPublisher::~GrpcWeightPublisher() { Shutdown(); }

void GrpcWeightPublisher::Shutdown() {
  if (server_ == nullptr) return;
  service_->Stop();
  // Streams blocked writing to a subscriber that stopped reading are cancelled at the deadline.
  server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  server_.reset();
}

absl::Status GrpcWeightPublisher::PublishWeights(int64_t version, const WeightView& weights) {
  return service_->Publish(version, weights);
}

PublisherStats GrpcWeightPublisher::stats() const { return service_->stats(); }

int64_t GrpcWeightPublisher::newest_version() const { return service_->newest_version(); }

void GrpcWeightPublisher::CorruptNextChunkForTesting() { service_->CorruptNextChunk(); }

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
    if (ended.code() == absl::StatusCode::kFailedPrecondition) {  // a model mismatch
      mailbox_->Fail(absl::FailedPreconditionError(
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
