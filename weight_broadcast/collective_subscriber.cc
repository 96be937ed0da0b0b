// CollectiveWeightSubscriber (collective_transport.h): the handshake, the heartbeat that
// announces this subscriber, and the receiver that joins every epoch it is put in.
#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "collective/rendezvous.h"
#include "collective/store_service.h"
#include "core/status_macros.h"
#include "weight_broadcast/collective_protocol.h"
#include "weight_broadcast/collective_transport.h"
#include "weight_broadcast/handshake.h"
#include "weight_broadcast/mailbox.h"

namespace prl {

using weight_broadcast_internal::EpochRecord;
using weight_broadcast_internal::HeaderKind;
using weight_broadcast_internal::WeightMailbox;
using weight_broadcast_internal::WireHeader;

namespace {

// How often a subscriber between epochs looks for the next one, and how often it re-reads the
// publisher's hello (a restarted publisher is a new instance).
constexpr absl::Duration kPollInterval = absl::Milliseconds(50);
constexpr absl::Duration kHelloInterval = absl::Milliseconds(500);

// The host part of "host:port" or "[v6]:port".
std::string HostOf(const std::string& address) {
  if (!address.empty() && address.front() == '[') {
    return address.substr(1, address.find(']') == std::string::npos ? 0 : address.find(']') - 1);
  }
  return address.substr(0, address.rfind(':'));
}

}  // namespace

// Everything of a subscriber. The heartbeat thread alone writes the announcement; the receiver
// thread tells it what to say (under mu_) and pokes it.
class CollectiveWeightSubscriber::Receiver {
 public:
  Receiver(const std::string& address, const WeightSpec& spec,
           const CollectiveSubscriberOptions& options, std::shared_ptr<collective::KvStore> store,
           std::string host)
      : address_(address),
        publisher_host_(HostOf(address)),
        host_(std::move(host)),
        id_(absl::StrCat(absl::Hex(weight_broadcast_internal::RandomId(), absl::kZeroPad16))),
        local_(LocalHandshake("nccl", spec,
                              weight_broadcast_internal::CollectiveDataPath(options.device))),
        options_(options),
        store_(std::move(store)),
        mailbox_(spec, options.device) {}
  ~Receiver();

  // Checks the publisher's hello: OK, or the handshake's error.
  absl::Status Handshake(absl::Duration timeout);
  void Start();
  WeightMailbox& mailbox() { return mailbox_; }

 private:
  enum class Publisher { kSame, kNew, kUnreachable, kMismatch };
  // Re-reads the hello; a new instance is adopted (after its handshake).
  Publisher CheckPublisher(absl::Duration timeout);
  void HeartbeatLoop();
  void ReceiveLoop();
  // Joins epoch `e` as `rank` and receives until it ends.
  void RunEpoch(const EpochRecord& e, int rank);
  // One version announced by `header`: received, verified, delivered. An error ends the epoch.
  absl::Status ReceiveVersion(collective::Communicator& comm, const WireHeader& header);
  void FinishedEpoch(int64_t epoch);
  void Poke();

  const std::string address_;
  const std::string publisher_host_;
  const std::string host_;  // this subscriber's address as the publisher reaches it
  const std::string id_;
  const WeightHandshake local_;
  const CollectiveSubscriberOptions options_;
  std::shared_ptr<collective::KvStore> store_;
  WeightMailbox mailbox_;
  weight_broadcast_internal::WeightBuffer spare_;  // a received buffer that was not delivered
  int64_t joins_ = 0;
  absl::Time hello_checked_ = absl::InfinitePast();

  std::mutex mu_;
  std::condition_variable poked_;
  bool closing_ = false;
  bool poke_ = false;
  uint64_t instance_ = 0;   // the publisher instance of the last handshake
  int64_t last_epoch_ = 0;  // the last epoch of that instance this subscriber finished with
  absl::Duration comm_timeout_;
  std::thread heartbeat_;
  std::thread receiver_;
};

CollectiveWeightSubscriber::Receiver::~Receiver() {
  mailbox_.Close();
  {
    std::lock_guard<std::mutex> lock(mu_);
    closing_ = true;
  }
  poked_.notify_all();
  if (heartbeat_.joinable()) heartbeat_.join();
  if (receiver_.joinable()) receiver_.join();
}

absl::Status CollectiveWeightSubscriber::Receiver::Handshake(absl::Duration timeout) {
  const std::string where = absl::StrCat("weight publisher ", address_);
  PRL_ASSIGN_OR_RETURN(const std::string text,
                       store_->Get(weight_broadcast_internal::kHelloKey, timeout));
  PRL_ASSIGN_OR_RETURN(const weight_broadcast_internal::Hello hello,
                       weight_broadcast_internal::DecodeHello(text, where));
  PRL_RETURN_IF_ERROR(CheckHandshake(hello.handshake, local_, where));
  std::lock_guard<std::mutex> lock(mu_);
  instance_ = hello.instance;
  last_epoch_ = 0;
  // Members wait for headers: at least three of the publisher's keepalive intervals.
  comm_timeout_ = std::max(options_.timeout, 3 * hello.keepalive);
  return absl::OkStatus();
}

CollectiveWeightSubscriber::Receiver::Publisher
CollectiveWeightSubscriber::Receiver::CheckPublisher(absl::Duration timeout) {
  uint64_t before;
  {
    std::lock_guard<std::mutex> lock(mu_);
    before = instance_;
  }
  absl::StatusOr<std::string> text = store_->Get(weight_broadcast_internal::kHelloKey, timeout);
  hello_checked_ = absl::Now();
  if (!text.ok()) {
    mailbox_.NoteError(text.status());
    return Publisher::kUnreachable;
  }
  absl::StatusOr<weight_broadcast_internal::Hello> hello =
      weight_broadcast_internal::DecodeHello(*text, address_);
  if (hello.ok() && hello->instance == before) return Publisher::kSame;
  const absl::Status same = Handshake(timeout);
  if (absl::IsFailedPrecondition(same)) {
    mailbox_.Fail(same);
    return Publisher::kMismatch;
  }
  if (!same.ok()) {
    mailbox_.NoteError(same);
    return Publisher::kUnreachable;
  }
  mailbox_.NoteReconnect(absl::UnavailableError(
      absl::StrCat("the weight publisher at ", address_, " restarted (a new instance)")));
  Poke();
  return Publisher::kNew;
}

void CollectiveWeightSubscriber::Receiver::Start() {
  heartbeat_ = std::thread([this] { HeartbeatLoop(); });
  receiver_ = std::thread([this] { ReceiveLoop(); });
}

void CollectiveWeightSubscriber::Receiver::Poke() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    poke_ = true;
  }
  poked_.notify_all();
}

void CollectiveWeightSubscriber::Receiver::FinishedEpoch(int64_t epoch) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    last_epoch_ = std::max(last_epoch_, epoch);
  }
  Poke();
}

void CollectiveWeightSubscriber::Receiver::HeartbeatLoop() {
  const std::string key = absl::StrCat(weight_broadcast_internal::kMemberPrefix, id_);
  weight_broadcast_internal::Announcement said;
  said.host = host_;
  bool reached = false;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      poked_.wait_for(lock, absl::ToChronoNanoseconds(options_.heartbeat_interval),
                      [&] { return closing_ || poke_; });
      if (closing_) break;
      poke_ = false;
      said.instance = instance_;
      said.epoch = last_epoch_;
    }
    said.beat += 1;
    said.version = mailbox_.last_version();
    const absl::Status set = store_->Set(key, EncodeAnnouncement(said));
    reached = set.ok();
    if (!set.ok()) mailbox_.NoteError(set);
  }
  // Gone for good: the publisher need not wait for this member's heartbeat to expire.
  if (reached) store_->Delete(key).IgnoreError();
}

void CollectiveWeightSubscriber::Receiver::ReceiveLoop() {
  Poke();  // announce at once
  while (!mailbox_.closed()) {
    if (absl::Now() - hello_checked_ >= kHelloInterval) {
      const Publisher publisher = CheckPublisher(kHelloInterval);
      if (publisher == Publisher::kMismatch) return;
      if (publisher == Publisher::kUnreachable) {
        if (!mailbox_.SleepUnlessClosed(kPollInterval)) return;
        continue;
      }
    }
    uint64_t instance;
    int64_t last_epoch;
    {
      std::lock_guard<std::mutex> lock(mu_);
      instance = instance_;
      last_epoch = last_epoch_;
    }
    absl::StatusOr<std::string> text =
        store_->Get(weight_broadcast_internal::kEpochKey, kPollInterval);
    absl::StatusOr<EpochRecord> record =
        text.ok() ? weight_broadcast_internal::DecodeEpoch(*text) : text.status();
    if (!record.ok() || record->instance != instance || record->epoch <= last_epoch) {
      if (record.ok() && record->instance != instance) hello_checked_ = absl::InfinitePast();
      if (!mailbox_.SleepUnlessClosed(kPollInterval)) return;
      continue;
    }
    const int rank = weight_broadcast_internal::RankOf(*record, id_);
    if (rank > 0) RunEpoch(*record, rank);
    // Left out (the publisher sees this subscriber available and forms the next epoch), or the
    // epoch is over.
    FinishedEpoch(record->epoch);
  }
}

void CollectiveWeightSubscriber::Receiver::RunEpoch(const EpochRecord& e, int rank) {
  collective::RendezvousConfig rendezvous;
  rendezvous.rank = rank;
  rendezvous.world_size = static_cast<int>(e.members.size()) + 1;
  rendezvous.master_addr = publisher_host_;
  rendezvous.group_name = weight_broadcast_internal::EpochGroupName(e.epoch);
  collective::CommunicatorOptions options;
  {
    std::lock_guard<std::mutex> lock(mu_);
    rendezvous.timeout = comm_timeout_;
    options.timeout = comm_timeout_;
  }
  absl::StatusOr<std::unique_ptr<collective::Communicator>> comm =
      options_.device.is_cuda()
          ? collective::ConnectNcclThrough(store_, rendezvous, options_.device, options)
          : collective::ConnectGlooThrough(store_, rendezvous, options);
  if (!comm.ok()) {
    mailbox_.NoteError(comm.status());
    return;
  }
  if (joins_++ > 0) {
    mailbox_.NoteReconnect(absl::OkStatus());  // re-joined: counted, last_error kept
  }
  while (!mailbox_.closed()) {
    std::array<uint8_t, weight_broadcast_internal::kWireHeaderBytes> bytes{};
    absl::Status got = (*comm)->BroadcastHost(absl::MakeSpan(bytes), 0);
    absl::StatusOr<WireHeader> header =
        got.ok() ? weight_broadcast_internal::DecodeHeader(bytes, e.epoch) : got;
    if (!header.ok()) {
      mailbox_.NoteError(header.status());
      return;
    }
    if (header->kind == HeaderKind::kLeave) return;
    if (header->kind == HeaderKind::kData && !ReceiveVersion(**comm, *header).ok()) return;
  }
}

absl::Status CollectiveWeightSubscriber::Receiver::ReceiveVersion(collective::Communicator& comm,
                                                                  const WireHeader& header) {
  const auto bytes = static_cast<uint64_t>(local_.weight_bytes);
  if (header.bytes != bytes) {
    const absl::Status bad =
        absl::DataLossError(absl::StrCat("weight broadcast: version ", header.version, " has ",
                                         header.bytes, " bytes, this model has ", bytes));
    mailbox_.NoteError(bad);
    return bad;
  }
  weight_broadcast_internal::WeightBuffer dest = std::move(spare_);
  spare_ = {};
  if (dest.empty()) {
    absl::StatusOr<weight_broadcast_internal::WeightBuffer> acquired = mailbox_.AcquireBuffer();
    if (!acquired.ok()) {
      mailbox_.Fail(acquired.status());
      return acquired.status();
    }
    dest = *std::move(acquired);
  }
  const absl::Time start = absl::Now();
  const Tensor payload(dest.data(), DType::kF32, options_.device,
                       {static_cast<int64_t>(bytes / 4)});
  absl::Status received = comm.Broadcast(payload, 0);
  absl::StatusOr<uint64_t> checksum = received.ok() ? weight_broadcast_internal::PayloadChecksum(
                                                          dest.data(), options_.device, bytes)
                                                    : received;
  if (!checksum.ok()) {
    spare_ = std::move(dest);
    mailbox_.NoteError(checksum.status());
    return checksum.status();
  }
  if (*checksum != header.checksum) {
    spare_ = std::move(dest);
    const std::string what =
        absl::StrCat("weight version ", header.version, " failed its checksum (XXH3-64 ",
                     absl::Hex(*checksum), ", publisher says ", absl::Hex(header.checksum),
                     "): discarded, leaving the group so that "
                     "the next one receives it again");
    mailbox_.NoteChecksumFailure(what);
    return absl::DataLossError(what);
  }
  if (header.version <= mailbox_.last_version()) {
    spare_ = std::move(dest);
    mailbox_.NoteIgnored(header.version);
    return absl::OkStatus();
  }
  mailbox_.Deliver(header.version, std::move(dest), absl::Now() - start);
  Poke();  // announce the newest version held
  return absl::OkStatus();
}

// ---- The public class -------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<CollectiveWeightSubscriber>> CollectiveWeightSubscriber::Connect(
    const std::string& address, const WeightSpec& spec,
    const CollectiveSubscriberOptions& options) {
  PRL_RETURN_IF_ERROR(ValidateWeightSpec(spec));
  if (options.timeout <= absl::ZeroDuration() ||
      options.heartbeat_interval <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CollectiveSubscriberOptions: need timeout > 0 and heartbeat_interval > 0, found ",
        absl::FormatDuration(options.timeout), " and ",
        absl::FormatDuration(options.heartbeat_interval)));
  }
  if (options.device.is_cuda() && !collective::NcclCompiled()) {
    return absl::UnimplementedError(absl::StrCat(
        "CollectiveSubscriberOptions.device is ", options.device.ToString(),
        " but this prl has no NCCL (built without CUDA or without NCCL): use a CPU device"));
  }
  PRL_ASSIGN_OR_RETURN(const std::string host, collective::LocalAddressFacing(HostOf(address)));
  // Stores and deletes give up on an unreachable publisher after a few heartbeats.
  const absl::Duration connect_timeout =
      std::min(options.timeout, std::max(absl::Seconds(1), 2 * options.heartbeat_interval));
  auto store = std::make_shared<collective::GrpcStore>(address, connect_timeout);
  auto subscriber = std::unique_ptr<CollectiveWeightSubscriber>(new CollectiveWeightSubscriber());
  subscriber->receiver_ = std::make_unique<Receiver>(address, spec, options, store, host);
  PRL_RETURN_IF_ERROR(subscriber->receiver_->Handshake(options.timeout));
  subscriber->receiver_->Start();
  return subscriber;
}

CollectiveWeightSubscriber::~CollectiveWeightSubscriber() = default;

absl::StatusOr<std::optional<VersionedWeights>> CollectiveWeightSubscriber::TakeNewer(
    int64_t have) {
  return receiver_->mailbox().TakeNewer(have);
}

absl::StatusOr<VersionedWeights> CollectiveWeightSubscriber::WaitNewer(int64_t have,
                                                                       absl::Duration timeout) {
  return receiver_->mailbox().WaitNewer(have, timeout);
}

SubscriberStats CollectiveWeightSubscriber::stats() const { return receiver_->mailbox().stats(); }

}  // namespace prl
