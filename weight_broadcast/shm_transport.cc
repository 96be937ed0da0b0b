#include "weight_broadcast/shm_transport.h"

#include <chrono>
#include <cstring>
#include <new>

#include "absl/strings/str_cat.h"
#include "core/futex.h"
#include "core/process_identity.h"
#include "core/status_macros.h"
#include "core/xxhash_inline.h"
#include "weight_broadcast/mailbox.h"
#include "weight_broadcast/shm_layout.h"
#include "weight_broadcast/shm_segment.h"

namespace prl {

using weight_broadcast_internal::kNothingPublished;
using weight_broadcast_internal::kShmAlign;
using weight_broadcast_internal::kShmLayoutVersion;
using weight_broadcast_internal::kShmMagic;
using weight_broadcast_internal::SegmentKind;
using weight_broadcast_internal::SharedSegment;
using weight_broadcast_internal::ShmFixedHeader;
using weight_broadcast_internal::ShmHeader;
using weight_broadcast_internal::WeightMailbox;

namespace {

constexpr SegmentKind kShmKind = {"weight segment", "RemoveShmWeightSegment, or delete /dev/shm/",
                                  kShmMagic, kShmLayoutVersion, kShmAlign};

ShmHeader& Header(const SharedSegment& m) { return *static_cast<ShmHeader*>(m.address()); }
uint8_t* Slot(const SharedSegment& m, int s) {
  return static_cast<uint8_t*>(m.address()) + Header(m).fixed.slot_offset[s];
}

uint64_t AlignUp(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

uint64_t FixedChecksum(const ShmFixedHeader& f) { return XXH3_64bits(&f, sizeof(f)); }

std::string Fingerprint(const ShmFixedHeader& f) {
  return std::string(f.fingerprint, strnlen(f.fingerprint, sizeof(f.fingerprint)));
}

// Maps an existing segment and checks that its header is one this build can use. Populating
// is for those who copy the slots (not for Inspect).
absl::StatusOr<std::unique_ptr<SharedSegment>> MapExisting(const std::string& name, bool writable,
                                                           bool populate = true) {
  PRL_ASSIGN_OR_RETURN(std::unique_ptr<SharedSegment> m,
                       SharedSegment::Open(name, writable, populate, kShmKind));
  const ShmHeader& h = Header(*m);
  weight_broadcast_internal::WaitUntilInitialized(h.initialized, kShmMagic);
  weight_broadcast_internal::SegmentPreamble p;
  p.magic = h.fixed.magic;
  p.layout_version = h.fixed.layout_version;
  p.segment_bytes = h.fixed.segment_bytes;
  p.checksum_ok = h.fixed_checksum == FixedChecksum(h.fixed);
  p.initialized = h.initialized.load(std::memory_order_acquire) == kShmMagic;
  PRL_RETURN_IF_ERROR(weight_broadcast_internal::CheckPreamble(p, m->size(), name, kShmKind));
  return m;
}

// The segment's side of the handshake (weight_broadcast/handshake.h).
WeightHandshake SegmentHandshake(const SharedSegment& m) {
  WeightHandshake h;
  h.transport = "shm";
  h.model_fingerprint = Fingerprint(Header(m).fixed);
  h.weight_bytes = static_cast<int64_t>(Header(m).fixed.weight_bytes);
  return h;
}

absl::StatusOr<std::unique_ptr<SharedSegment>> CreateNew(const std::string& name,
                                                         const WeightSpec& spec) {
  const std::string fingerprint = WeightFingerprint(spec);
  ShmFixedHeader f{};
  if (fingerprint.size() >= sizeof(f.fingerprint)) {
    return absl::InvalidArgumentError(absl::StrCat("model fingerprint is ", fingerprint.size(),
                                                   " bytes, the segment header holds ",
                                                   sizeof(f.fingerprint) - 1));
  }
  f.magic = kShmMagic;
  f.layout_version = kShmLayoutVersion;
  f.weight_bytes = static_cast<uint64_t>(WeightBytes(spec));
  f.slot_offset[0] = kShmAlign;
  f.slot_offset[1] = f.slot_offset[0] + AlignUp(f.weight_bytes, kShmAlign);
  f.segment_bytes = f.slot_offset[1] + AlignUp(f.weight_bytes, kShmAlign);
  f.created_unix_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                          std::chrono::system_clock::now().time_since_epoch())
                          .count();
  std::memcpy(f.fingerprint, fingerprint.data(), fingerprint.size());
  PRL_ASSIGN_OR_RETURN(std::unique_ptr<SharedSegment> m,
                       SharedSegment::Create(name, f.segment_bytes, kShmKind));
  auto* h = new (m->address()) ShmHeader();  // the pages are zero; construct the atomics
  h->fixed = f;
  h->fixed_checksum = FixedChecksum(f);
  h->published.store(kNothingPublished, std::memory_order_relaxed);
  h->initialized.store(kShmMagic, std::memory_order_release);
  return m;
}

}  // namespace

// ---- Publisher ----------------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<ShmWeightPublisher>> ShmWeightPublisher::Create(
    const std::string& name, const WeightSpec& spec) {
  PRL_RETURN_IF_ERROR(weight_broadcast_internal::ValidateSegmentName(name, kShmKind));
  PRL_RETURN_IF_ERROR(ValidateWeightSpec(spec));
  const WeightHandshake local = LocalHandshake("shm", spec);
  absl::StatusOr<std::unique_ptr<SharedSegment>> m = CreateNew(name, spec);
  if (m.status().code() == absl::StatusCode::kAlreadyExists) {
    // A restarted publisher: adopt the segment if its publisher is gone and it fits.
    m = MapExisting(name, /*writable=*/true);
    if (m.ok()) {
      PRL_RETURN_IF_ERROR(CheckHandshake(SegmentHandshake(**m), local,
                                         absl::StrCat("weight segment '", name, "'")));
    }
  }
  if (!m.ok()) return m.status();
  ShmHeader& h = Header(**m);
  PRL_RETURN_IF_ERROR(weight_broadcast_internal::ClaimPublisher(h.publisher, name, kShmKind));
  auto publisher = std::unique_ptr<ShmWeightPublisher>(new ShmWeightPublisher(name, *std::move(m)));
  publisher->handshake_ = local;
  publisher->stats_.version_bytes = static_cast<int64_t>(h.fixed.weight_bytes);
  const uint64_t published = h.published.load(std::memory_order_acquire);
  if (published != kNothingPublished) {
    const int64_t held = weight_broadcast_internal::PublishedVersion(published);
    publisher->versions_.Held(held);
    publisher->stats_.last_version = held;
  }
  return publisher;
}

ShmWeightPublisher::ShmWeightPublisher(std::string name, std::unique_ptr<SharedSegment> m)
    : name_(std::move(name)), mapping_(std::move(m)) {}

ShmWeightPublisher::~ShmWeightPublisher() {
  weight_broadcast_internal::ReleasePublisher(Header(*mapping_).publisher);
}

absl::Status ShmWeightPublisher::PublishWeights(int64_t version, const WeightView& weights) {
  const absl::Time start = absl::Now();
  ShmHeader& h = Header(*mapping_);
  const std::string where = absl::StrCat("Publish to weight segment '", name_, "'");
  PRL_RETURN_IF_ERROR(versions_.CheckNext(
      version, where,
      absl::StrCat(" (a restarted learner resumes above newest_version(); to start over, remove "
                   "the segment first with ",
                   kShmKind.remove_hint, name_, ")")));
  PRL_RETURN_IF_ERROR(CheckPublishedWeights(handshake_, weights, where));
  const int s = weight_broadcast_internal::SlotToWrite(h.published.load(std::memory_order_acquire));
  const uint64_t writing = weight_broadcast_internal::BeginSlotWrite(h.slots[s], version);
  PRL_RETURN_IF_ERROR(
      CopyBytes(Slot(*mapping_, s), Device::Cpu(), weights.data, weights.device, weights.bytes));
  weight_broadcast_internal::EndSlotWrite(h.slots[s], writing, h.published, version, s);
  FutexBumpAndWake(&h.futex);
  versions_.Published(version);

  std::lock_guard<std::mutex> lock(stats_mu_);
  stats_.versions_published += 1;
  stats_.last_version = version;
  stats_.last_publish_seconds = absl::ToDoubleSeconds(absl::Now() - start);
  stats_.total_publish_seconds += stats_.last_publish_seconds;
  return absl::OkStatus();
}

PublisherStats ShmWeightPublisher::stats() const {
  std::lock_guard<std::mutex> lock(stats_mu_);
  return stats_;
}

// ---- Subscriber ---------------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<ShmWeightSubscriber>> ShmWeightSubscriber::Open(
    const std::string& name, const WeightSpec& spec, const ShmSubscriberOptions& options) {
  PRL_RETURN_IF_ERROR(ValidateWeightSpec(spec));
  const absl::Time deadline = absl::Now() + options.open_timeout;
  absl::StatusOr<std::unique_ptr<SharedSegment>> m = MapExisting(name, /*writable=*/false);
  while ((m.status().code() == absl::StatusCode::kNotFound ||
          m.status().code() == absl::StatusCode::kUnavailable) &&
         absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(50));
    m = MapExisting(name, /*writable=*/false);
  }
  if (!m.ok()) return m.status();
  PRL_RETURN_IF_ERROR(CheckHandshake(SegmentHandshake(**m), LocalHandshake("shm", spec),
                                     absl::StrCat("weight segment '", name, "'")));
  auto subscriber = std::unique_ptr<ShmWeightSubscriber>(
      new ShmWeightSubscriber(*std::move(m), spec, options.device));
  subscriber->receiver_ = std::thread([s = subscriber.get()] { s->ReceiveLoop(); });
  return subscriber;
}

ShmWeightSubscriber::ShmWeightSubscriber(std::unique_ptr<SharedSegment> m,
                                         const WeightSpec& spec, Device device)
    : mapping_(std::move(m)), mailbox_(std::make_unique<WeightMailbox>(spec, device)) {}

ShmWeightSubscriber::~ShmWeightSubscriber() {
  mailbox_->Close();
  if (receiver_.joinable()) receiver_.join();
}

void ShmWeightSubscriber::ReceiveLoop() {
  // Bounds how long a closed subscriber's receiver sleeps before it notices (the futex lives in
  // a read-only mapping: this side cannot wake itself through it).
  constexpr int64_t kWaitSliceNs = 50'000'000;
  const ShmHeader& h = Header(*mapping_);
  const uint64_t bytes = h.fixed.weight_bytes;
  auto* futex = const_cast<std::atomic<uint32_t>*>(&h.futex);
  while (!mailbox_->closed()) {
    const uint32_t seen = futex->load(std::memory_order_acquire);
    const int64_t have = mailbox_->last_version();
    const uint64_t newest = h.published.load(std::memory_order_acquire);
    if (newest == kNothingPublished ||
        weight_broadcast_internal::PublishedVersion(newest) <= have) {
      FutexWait(futex, seen, kWaitSliceNs);
      continue;
    }
    absl::StatusOr<weight_broadcast_internal::WeightBuffer> dest = mailbox_->AcquireBuffer();
    if (!dest.ok()) {
      mailbox_->Fail(dest.status());
      return;
    }
    const absl::Time start = absl::Now();
    for (;;) {  // seqlock read; see seqlock.h
      const std::optional<weight_broadcast_internal::SlotRead> r =
          weight_broadcast_internal::BeginSlotRead(h.published, h.slots[0], h.slots[1]);
      if (r.has_value()) {
        const absl::Status copied = CopyBytes(dest->data(), dest->device(),
                                              Slot(*mapping_, r->slot), Device::Cpu(), bytes);
        if (!copied.ok()) {
          mailbox_->Fail(copied);
          return;
        }
        if (weight_broadcast_internal::SlotReadValid(h.slots[r->slot], *r)) {
          mailbox_->Deliver(r->version, *std::move(dest), absl::Now() - start);
          break;
        }
      }
      // Lapped: the publisher rewrote this slot meanwhile; the newest is elsewhere by now.
      mailbox_->NoteRetry();
      if (mailbox_->closed()) return;
    }
  }
}

absl::StatusOr<std::optional<VersionedWeights>> ShmWeightSubscriber::TakeNewer(int64_t have) {
  return mailbox_->TakeNewer(have);
}

absl::StatusOr<VersionedWeights> ShmWeightSubscriber::WaitNewer(int64_t have,
                                                                absl::Duration timeout) {
  return mailbox_->WaitNewer(have, timeout);
}

SubscriberStats ShmWeightSubscriber::stats() const { return mailbox_->stats(); }

// ---- Segment management -------------------------------------------------------------------

absl::StatusOr<ShmSegmentInfo> InspectShmWeightSegment(const std::string& name) {
  PRL_ASSIGN_OR_RETURN(std::unique_ptr<SharedSegment> m,
                       MapExisting(name, /*writable=*/false, /*populate=*/false));
  const ShmHeader& h = Header(*m);
  ShmSegmentInfo info;
  info.name = name;
  info.layout_version = h.fixed.layout_version;
  info.weight_bytes = static_cast<int64_t>(h.fixed.weight_bytes);
  info.segment_bytes = static_cast<int64_t>(h.fixed.segment_bytes);
  info.model_fingerprint = Fingerprint(h.fixed);
  const uint64_t newest = h.published.load(std::memory_order_acquire);
  if (newest != kNothingPublished) {
    info.newest_version = weight_broadcast_internal::PublishedVersion(newest);
  }
  const ProcessToken publisher = h.publisher.load(std::memory_order_acquire);
  info.publisher_pid = publisher == 0 ? 0 : TokenPid(publisher);
  info.publisher_alive = publisher != 0 && ProcessAlive(publisher);
  for (const weight_broadcast_internal::SeqlockSlot& slot : h.slots) {
    if ((slot.sequence.load(std::memory_order_acquire) & 1) != 0) info.write_in_progress = true;
  }
  return info;
}

absl::Status RemoveShmWeightSegment(const std::string& name) {
  return weight_broadcast_internal::RemoveSegment(name, kShmKind);
}

}  // namespace prl
