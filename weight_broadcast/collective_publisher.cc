// CollectiveWeightPublisher (collective_transport.h): the store, the snapshots and the
// broadcaster thread that forms epochs and sends the newest snapshot to them.
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "collective/kv_store.h"
#include "collective/rendezvous.h"
#include "collective/store_service.h"
#include "core/cuda_runtime.h"
#include "core/status_macros.h"
#include "weight_broadcast/collective_protocol.h"
#include "weight_broadcast/collective_transport.h"
#include "weight_broadcast/handshake.h"
#include "weight_broadcast/version_file.h"
#include "weight_broadcast/versioning.h"

namespace prl {

using weight_broadcast_internal::EncodeHeader;
using weight_broadcast_internal::HeaderKind;
using weight_broadcast_internal::kMemberPrefix;
using weight_broadcast_internal::MemberTable;
using weight_broadcast_internal::WireHeader;

namespace {

// How often the broadcaster looks at the members when nothing was published.
constexpr absl::Duration kPollInterval = absl::Milliseconds(50);

absl::Status ValidateOptions(const CollectivePublisherOptions& o) {
  if (o.timeout <= absl::ZeroDuration() || o.keepalive_interval <= absl::ZeroDuration() ||
      o.keepalive_interval * 2 > o.timeout || o.member_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CollectivePublisherOptions: need 0 < keepalive_interval <= timeout / 2 and "
        "member_timeout > 0, found keepalive_interval ",
        absl::FormatDuration(o.keepalive_interval), ", timeout ", absl::FormatDuration(o.timeout),
        ", member_timeout ", absl::FormatDuration(o.member_timeout)));
  }
  return absl::OkStatus();
}

}  // namespace

// Everything of a publisher; the broadcaster thread owns the epoch and the member table, the
// mutex guards the snapshots and the statistics.
class CollectiveWeightPublisher::Broadcaster {
 public:
  Broadcaster(const WeightSpec& spec, const CollectivePublisherOptions& options)
      : options_(options),
        handshake_(LocalHandshake("nccl", spec,
                                  weight_broadcast_internal::CollectiveDataPath(options.device))),
        instance_(weight_broadcast_internal::RandomId()),
        table_(instance_, options.member_timeout) {
    stats_.version_bytes = handshake_.weight_bytes;
  }
  ~Broadcaster();

  absl::Status Start();
  absl::Status Publish(int64_t version, const WeightView& weights);
  int64_t newest_version() const { return versions_.newest(); }
  PublisherStats stats() const {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
  }
  int port() const { return server_->port(); }
  void CorruptNextChecksum() { corrupt_next_ = true; }

 private:
  // One published version, on the publisher's device; shared read-only with the broadcaster.
  struct Snapshot {
    int64_t version = -1;
    int64_t index = 0;  // 1 for the first Publish, 2 for the next, ...
    Buffer bytes;
    std::optional<uint64_t> checksum;  // computed by the broadcaster when it first sends it
  };
  struct Epoch {
    int64_t number = 0;
    std::vector<std::string> members;  // rank i + 1 is members[i]
    std::unique_ptr<collective::Communicator> comm;
    int64_t sent_index = 0;  // the newest snapshot this epoch received
    absl::Time last_send;
  };

  void Loop();
  void Form(const std::vector<std::string>& members);
  // Sends what the current epoch needs (a newer snapshot, or a keepalive); ends it on failure.
  void Serve();
  absl::Status SendSnapshot(Snapshot& snapshot);
  absl::Status SendHeader(const WireHeader& header);
  // Ends the current epoch; with `announce`, tells its members first (best effort).
  void EndEpoch(const absl::Status& why, bool announce);
  absl::StatusOr<std::unique_ptr<collective::Communicator>> Join(
      const collective::RendezvousConfig& rendezvous);

  const CollectivePublisherOptions options_;
  const WeightHandshake handshake_;
  const uint64_t instance_;
  std::shared_ptr<collective::MemoryStore> store_ = std::make_shared<collective::MemoryStore>();
  std::unique_ptr<collective::StoreServer> server_;
  VersionSequence versions_;
  std::atomic<bool> corrupt_next_{false};

  // The broadcaster thread's.
  MemberTable table_;
  std::optional<Epoch> epoch_;
  int64_t epochs_ = 0;
  int64_t last_sent_index_ = 0;  // over all epochs, for the skip count

  mutable std::mutex mu_;
  std::condition_variable wake_;  // a new snapshot, or stopping
  bool stopping_ = false;
  std::shared_ptr<Snapshot> latest_;
  std::shared_ptr<Snapshot> retired_;  // the previous latest_, kept for its memory
  int64_t published_ = 0;
  PublisherStats stats_;
  std::thread thread_;
};

absl::Status CollectiveWeightPublisher::Broadcaster::Start() {
  if (!options_.version_file.empty()) {  // what an earlier publisher of the run made visible
    PRL_ASSIGN_OR_RETURN(const int64_t held, ReadPublishedVersion(options_.version_file));
    if (held >= 0) versions_.Held(held);
  }
  // The weight group's store: the actors join through it, the learner publishes.
  static const rpc::AccessPolicy kWeightGroup = {
      {"/prl.v1.StoreService/", {rpc::Role::kActor, rpc::Role::kLearner}}};
  PRL_ASSIGN_OR_RETURN(server_,
                       collective::StoreServer::Start(store_.get(), options_.address, kWeightGroup));
  weight_broadcast_internal::Hello hello;
  hello.instance = instance_;
  hello.keepalive = options_.keepalive_interval;
  hello.handshake = handshake_;
  PRL_RETURN_IF_ERROR(store_->Set(weight_broadcast_internal::kHelloKey, EncodeHello(hello)));
  thread_ = std::thread([this] { Loop(); });
  return absl::OkStatus();
}

CollectiveWeightPublisher::Broadcaster::~Broadcaster() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
  server_.reset();  // after the thread: an epoch formation uses the store
}

absl::Status CollectiveWeightPublisher::Broadcaster::Publish(int64_t version,
                                                             const WeightView& weights) {
  const absl::Time start = absl::Now();
  constexpr absl::string_view kWhere = "Publish to the collective weight broadcaster";
  PRL_RETURN_IF_ERROR(versions_.CheckNext(version, kWhere));
  PRL_RETURN_IF_ERROR(CheckPublishedWeights(handshake_, weights, kWhere));
  if (!options_.version_file.empty()) {  // durable before any subscriber can see it
    PRL_RETURN_IF_ERROR(WritePublishedVersion(options_.version_file, version));
  }
  const auto bytes = static_cast<size_t>(handshake_.weight_bytes);
  std::shared_ptr<Snapshot> snapshot;
  {
    std::lock_guard<std::mutex> lock(mu_);
    // Only the newest snapshot is ever handed to the broadcaster: once it lets go of the
    // previous one, nobody can take a new reference to it.
    if (retired_ != nullptr && retired_.use_count() == 1) {
      std::atomic_thread_fence(std::memory_order_acquire);  // after the broadcaster's reads
      snapshot = std::move(retired_);
    }
  }
  if (snapshot == nullptr) {
    snapshot = std::make_shared<Snapshot>();
    PRL_ASSIGN_OR_RETURN(snapshot->bytes, Buffer::Allocate(options_.device, bytes));
  }
  PRL_RETURN_IF_ERROR(
      CopyBytes(snapshot->bytes.data(), options_.device, weights.data, weights.device, bytes));
  snapshot->version = version;
  snapshot->checksum.reset();
  versions_.Published(version);
  {
    std::lock_guard<std::mutex> lock(mu_);
    snapshot->index = ++published_;
    retired_ = std::move(latest_);
    latest_ = std::move(snapshot);
    stats_.versions_published += 1;
    stats_.last_version = version;
    stats_.last_publish_seconds = absl::ToDoubleSeconds(absl::Now() - start);
    stats_.total_publish_seconds += stats_.last_publish_seconds;
  }
  wake_.notify_all();
  return absl::OkStatus();
}

void CollectiveWeightPublisher::Broadcaster::Loop() {
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) break;
    }
    const absl::Time now = absl::Now();
    for (const std::string& id : table_.Refresh(store_->List(kMemberPrefix), now)) {
      store_->Delete(absl::StrCat(kMemberPrefix, id)).IgnoreError();  // stopped beating
    }
    versions_.Reported(table_.NewestReportedVersion());
    if (epoch_.has_value()) {
      Serve();
    } else if (table_.ReadyToForm(now, options_.timeout)) {
      const std::vector<std::string> members = table_.Available();
      if (!members.empty()) Form(members);
    }
    std::unique_lock<std::mutex> lock(mu_);
    wake_.wait_for(lock, absl::ToChronoNanoseconds(kPollInterval), [&] {
      return stopping_ ||
             (epoch_.has_value() && latest_ != nullptr && latest_->index > epoch_->sent_index);
    });
  }
  if (epoch_.has_value()) {
    EndEpoch(absl::CancelledError("the weight publisher stopped"), /*announce=*/true);
  }
}

absl::StatusOr<std::unique_ptr<collective::Communicator>>
CollectiveWeightPublisher::Broadcaster::Join(const collective::RendezvousConfig& rendezvous) {
  collective::CommunicatorOptions comm;
  comm.timeout = options_.timeout;
  if (options_.device.is_cuda()) {
    return collective::ConnectNcclThrough(store_, rendezvous, options_.device, comm);
  }
  return collective::ConnectGlooThrough(store_, rendezvous, comm);
}

void CollectiveWeightPublisher::Broadcaster::Form(const std::vector<std::string>& members) {
  weight_broadcast_internal::EpochRecord record;
  record.instance = instance_;
  record.epoch = ++epochs_;
  record.members = members;
  table_.Assign(members, record.epoch);
  collective::RendezvousConfig rendezvous;
  rendezvous.rank = 0;
  rendezvous.world_size = static_cast<int>(members.size()) + 1;
  // Gloo listens on the interface that reaches the members (they announce their address).
  rendezvous.master_addr = table_.HostOf(members.front());
  if (rendezvous.master_addr.empty()) rendezvous.master_addr = "127.0.0.1";
  rendezvous.timeout = options_.timeout;
  rendezvous.group_name = weight_broadcast_internal::EpochGroupName(record.epoch);
  const absl::Status announced =
      store_->Set(weight_broadcast_internal::kEpochKey, EncodeEpoch(record));
  absl::StatusOr<std::unique_ptr<collective::Communicator>> comm =
      announced.ok() ? Join(rendezvous)
                     : absl::StatusOr<std::unique_ptr<collective::Communicator>>(announced);
  if (!comm.ok()) {
    table_.Ended(members, absl::Now());
    std::lock_guard<std::mutex> lock(mu_);
    stats_.groups_failed += 1;
    stats_.last_error = absl::StrCat("epoch ", record.epoch, " of ", members.size(),
                                     " subscriber(s) did not form: ", comm.status().ToString());
    return;
  }
  epoch_.emplace();
  epoch_->number = record.epoch;
  epoch_->members = members;
  epoch_->comm = *std::move(comm);
  epoch_->last_send = absl::Now();
  std::lock_guard<std::mutex> lock(mu_);
  stats_.groups_formed += 1;
  stats_.subscribers = static_cast<int64_t>(members.size());
}

void CollectiveWeightPublisher::Broadcaster::Serve() {
  if (table_.HasNewcomer(epoch_->members)) {
    EndEpoch(absl::OkStatus(), /*announce=*/true);  // re-formed with the newcomer
    return;
  }
  if (table_.AnyExpired(epoch_->members)) {
    EndEpoch(absl::UnavailableError("a member stopped announcing itself"), /*announce=*/true);
    return;
  }
  if (table_.AnyLeft(epoch_->members)) {
    EndEpoch(absl::OkStatus(), /*announce=*/true);  // a member said goodbye: re-formed without
    return;
  }
  std::shared_ptr<Snapshot> newest;
  {
    std::lock_guard<std::mutex> lock(mu_);
    newest = latest_;
  }
  absl::Status sent;
  if (newest != nullptr && newest->index > epoch_->sent_index) {
    sent = SendSnapshot(*newest);
  } else if (absl::Now() - epoch_->last_send >= options_.keepalive_interval) {
    WireHeader idle;
    idle.kind = HeaderKind::kIdle;
    idle.epoch = epoch_->number;
    sent = SendHeader(idle);
  }
  if (!sent.ok()) EndEpoch(sent, /*announce=*/false);
}

absl::Status CollectiveWeightPublisher::Broadcaster::SendHeader(const WireHeader& header) {
  std::array<uint8_t, weight_broadcast_internal::kWireHeaderBytes> bytes = EncodeHeader(header);
  PRL_RETURN_IF_ERROR(epoch_->comm->BroadcastHost(absl::MakeSpan(bytes), 0));
  epoch_->last_send = absl::Now();
  return absl::OkStatus();
}

absl::Status CollectiveWeightPublisher::Broadcaster::SendSnapshot(Snapshot& snapshot) {
  const size_t bytes = snapshot.bytes.bytes();
  if (!snapshot.checksum.has_value()) {
    PRL_ASSIGN_OR_RETURN(snapshot.checksum, weight_broadcast_internal::PayloadChecksum(
                                                snapshot.bytes.data(), options_.device, bytes));
  }
  WireHeader header;
  header.kind = HeaderKind::kData;
  header.epoch = epoch_->number;
  header.version = snapshot.version;
  header.bytes = bytes;
  header.checksum = *snapshot.checksum;
  if (corrupt_next_.exchange(false)) header.checksum ^= 1;
  PRL_RETURN_IF_ERROR(SendHeader(header));
  const Tensor payload(snapshot.bytes.data(), DType::kF32, options_.device,
                       {static_cast<int64_t>(bytes / 4)});
  PRL_RETURN_IF_ERROR(epoch_->comm->Broadcast(payload, 0));
  epoch_->sent_index = snapshot.index;
  epoch_->last_send = absl::Now();
  std::lock_guard<std::mutex> lock(mu_);
  stats_.versions_sent += 1;
  stats_.bytes_sent += static_cast<int64_t>(bytes);
  if (last_sent_index_ > 0 && snapshot.index > last_sent_index_) {
    stats_.versions_skipped += snapshot.index - last_sent_index_ - 1;
  }
  last_sent_index_ = std::max(last_sent_index_, snapshot.index);
  return absl::OkStatus();
}

void CollectiveWeightPublisher::Broadcaster::EndEpoch(const absl::Status& why, bool announce) {
  if (announce) {
    WireHeader leave;
    leave.kind = HeaderKind::kLeave;
    leave.epoch = epoch_->number;
    SendHeader(leave).IgnoreError();  // a member that does not hear it fails its next wait
  }
  table_.Ended(epoch_->members, absl::Now());
  const int64_t number = epoch_->number;
  epoch_.reset();  // closes the group
  std::lock_guard<std::mutex> lock(mu_);
  stats_.subscribers = 0;
  if (!why.ok() && !absl::IsCancelled(why)) {
    stats_.groups_failed += 1;
    stats_.last_error = absl::StrCat("epoch ", number, " failed: ", why.ToString());
  }
}

// ---- The public class -------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<CollectiveWeightPublisher>> CollectiveWeightPublisher::Start(
    const WeightSpec& spec, const CollectivePublisherOptions& options) {
  PRL_RETURN_IF_ERROR(ValidateWeightSpec(spec));
  PRL_RETURN_IF_ERROR(ValidateOptions(options));
  if (options.device.is_cuda()) {
    if (!collective::NcclCompiled()) {
      return absl::UnimplementedError(absl::StrCat(
          "CollectivePublisherOptions.device is ", options.device.ToString(),
          " but this prl has no NCCL (built without CUDA or without NCCL): use a CPU device "
          "(Gloo) or the grpc transport"));
    }
    if (options.device.index >= cuda::DeviceCount()) {
      return absl::FailedPreconditionError(
          absl::StrCat("CollectivePublisherOptions.device is ", options.device.ToString(),
                       " but this machine has ", cuda::DeviceCount(), " usable CUDA GPU(s)"));
    }
  }
  auto publisher = std::unique_ptr<CollectiveWeightPublisher>(new CollectiveWeightPublisher());
  publisher->broadcaster_ = std::make_unique<Broadcaster>(spec, options);
  PRL_RETURN_IF_ERROR(publisher->broadcaster_->Start());
  return publisher;
}

CollectiveWeightPublisher::~CollectiveWeightPublisher() = default;

absl::Status CollectiveWeightPublisher::PublishWeights(int64_t version,
                                                      const WeightView& weights) {
  return broadcaster_->Publish(version, weights);
}

int64_t CollectiveWeightPublisher::newest_version() const { return broadcaster_->newest_version(); }

PublisherStats CollectiveWeightPublisher::stats() const { return broadcaster_->stats(); }

int CollectiveWeightPublisher::port() const { return broadcaster_->port(); }

void CollectiveWeightPublisher::CorruptNextChecksumForTesting() {
  broadcaster_->CorruptNextChecksum();
}

}  // namespace prl
