#include "weight_broadcast/grpc_channel.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "core/xxhash_inline.h"
#include "rpc/grpc_util.h"
#include "weight_broadcast/grpc_transport.h"
#include "weight_broadcast/version_file.h"

namespace prl::weight_broadcast_internal {

namespace {
// How often waiting server streams look for a cancelled client or a stop.
constexpr auto kServerPoll = std::chrono::milliseconds(100);
}  // namespace

// One published version, shared read-only by every stream that sends it.
struct GrpcWeightChannel::Snapshot {
  int64_t version = 0;
  int64_t index = 0;  // 1 for the first Publish, 2 for the next, ...
  Buffer bytes;       // CPU copy of the fp32 buffer
  uint64_t checksum = 0;
};

GrpcWeightChannel::GrpcWeightChannel(const WeightSpec& spec, const GrpcPublisherOptions& options,
                                     std::string version_file)
    : handshake_(LocalHandshake("grpc", spec)),
      config_json_(ModelConfigToJson(spec.model)),
      weight_bytes_(handshake_.weight_bytes),
      chunk_bytes_(options.chunk_bytes),
      stall_timeout_(options.stall_timeout),
      version_file_(std::move(version_file)) {
  stats_.version_bytes = weight_bytes_;
}

absl::Status GrpcWeightChannel::LoadHeldVersion() {
  if (version_file_.empty()) return absl::OkStatus();
  PRL_ASSIGN_OR_RETURN(const int64_t held, ReadPublishedVersion(version_file_));
  if (held >= 0) versions_.Held(held);
  return absl::OkStatus();
}

grpc::Status GrpcWeightChannel::Stream(grpc::ServerContext* context,
                                       const v1::SubscribeRequest& request,
                                       grpc::ServerWriter<v1::WeightChunk>* writer) {
  // The request carries only the subscriber's fingerprint; the rest of its side is checked by
  // the subscriber against the first chunk.
  WeightHandshake theirs = handshake_;
  theirs.model_fingerprint = request.model_fingerprint();
  const absl::Status same = CheckHandshake(handshake_, theirs, "weight server");
  if (!same.ok()) return rpc::ToGrpcStatus(same);
  versions_.Reported(request.have_version());
  AddSubscribers(1);
  const absl::Cleanup disconnected = [this] { AddSubscribers(-1); };
  int64_t have = request.have_version();
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
}

absl::Status GrpcWeightChannel::Publish(int64_t version, const WeightView& weights) {
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

void GrpcWeightChannel::Stop(grpc::Status why) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stopping_) return;
  stopping_ = true;
  stop_status_ = std::move(why);
  changed_.notify_all();
}

PublisherStats GrpcWeightChannel::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void GrpcWeightChannel::AddSubscribers(int64_t delta) {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.subscribers += delta;
}

void GrpcWeightChannel::Sending(grpc::ServerContext* context, int64_t index) {
  std::lock_guard<std::mutex> lock(mu_);
  if (index < 0) {
    sending_.erase(context);
  } else {
    sending_[context] = Transfer{index, absl::Now()};
  }
}

void GrpcWeightChannel::CutStalledStreamsLocked() {
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

grpc::Status GrpcWeightChannel::EndOfStream() {
  std::lock_guard<std::mutex> lock(mu_);
  if (stopping_) return stop_status_;
  return grpc::Status(grpc::StatusCode::CANCELLED, "subscriber cancelled");
}

std::shared_ptr<const GrpcWeightChannel::Snapshot> GrpcWeightChannel::WaitNewer(
    int64_t have, grpc::ServerContext* context) {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_ && !context->IsCancelled()) {
    if (latest_ != nullptr && latest_->version > have) return latest_;
    changed_.wait_for(lock, kServerPoll);
  }
  return nullptr;
}

bool GrpcWeightChannel::Send(const Snapshot& s, grpc::ServerContext* context,
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

bool GrpcWeightChannel::stopping() {
  std::lock_guard<std::mutex> lock(mu_);
  return stopping_;
}

// ---- The service ------------------------------------------------------------------------------

grpc::Status GrpcWeightService::Subscribe(grpc::ServerContext* context,
                                          const v1::SubscribeRequest* request,
                                          grpc::ServerWriter<v1::WeightChunk>* writer) {
  return rpc::Guarded("prl.v1.WeightService/Subscribe", [&]() -> grpc::Status {
    const std::string& id = request->adapter_id();
    std::shared_ptr<GrpcWeightChannel> channel;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopped_) {
        return grpc::Status(grpc::StatusCode::UNAVAILABLE, "weight publisher shutting down");
      }
      if (removed_.contains(id)) {
        return grpc::Status(grpc::StatusCode::NOT_FOUND,
                            absl::StrCat("adapter_id: '", id.substr(0, 64), "' was deleted"));
      }
      auto it = channels_.find(id);
      if (it != channels_.end()) channel = it->second;
    }
    if (channel == nullptr) {
      return grpc::Status(
          grpc::StatusCode::UNAVAILABLE,
          id.empty() ? std::string("this weight server serves adapters only: adapter_id: "
                                   "expected an adapter's id, found none")
                     : absl::StrCat("adapter_id: '", id.substr(0, 64),
                                    "' is not served here yet (the learner makes it when it "
                                    "hears of the adapter)"));
    }
    return channel->Stream(context, *request, writer);
  });
}

void GrpcWeightService::Add(const std::string& adapter_id,
                            std::shared_ptr<GrpcWeightChannel> channel) {
  std::shared_ptr<GrpcWeightChannel> replaced;
  {
    std::lock_guard<std::mutex> lock(mu_);
    removed_.erase(adapter_id);
    replaced = std::exchange(channels_[adapter_id], std::move(channel));
  }
  if (replaced != nullptr) {
    replaced->Stop(grpc::Status(grpc::StatusCode::UNAVAILABLE, "weight channel replaced"));
  }
}

void GrpcWeightService::Detach(const std::string& adapter_id, const GrpcWeightChannel* channel) {
  std::shared_ptr<GrpcWeightChannel> detached;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = channels_.find(adapter_id);
    if (it == channels_.end() || it->second.get() != channel) return;
    detached = std::move(it->second);
    channels_.erase(it);
  }
  detached->Stop(grpc::Status(grpc::StatusCode::UNAVAILABLE, "weight channel closed"));
}

void GrpcWeightService::Remove(const std::string& adapter_id) {
  std::shared_ptr<GrpcWeightChannel> removed;
  {
    std::lock_guard<std::mutex> lock(mu_);
    removed_.insert(adapter_id);
    auto it = channels_.find(adapter_id);
    if (it != channels_.end()) {
      removed = std::move(it->second);
      channels_.erase(it);
    }
  }
  if (removed != nullptr) {
    removed->Stop(grpc::Status(
        grpc::StatusCode::NOT_FOUND,
        absl::StrCat("adapter_id: '", adapter_id.substr(0, 64), "' was deleted")));
  }
}

void GrpcWeightService::StopAll() {
  std::map<std::string, std::shared_ptr<GrpcWeightChannel>> channels;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopped_ = true;
    channels = channels_;
  }
  for (auto& [id, channel] : channels) {
    channel->Stop(grpc::Status(grpc::StatusCode::UNAVAILABLE, "weight publisher shutting down"));
  }
}

}  // namespace prl::weight_broadcast_internal
