#include "weight_broadcast/shm_transport.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <boost/interprocess/shared_memory_object.hpp>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <new>
#include <thread>

#include "absl/strings/str_cat.h"
#include "core/futex.h"
#include "core/process_identity.h"
#include "core/shared_mapping.h"
#include "core/status_macros.h"
#include "core/xxhash_inline.h"
#include "weight_broadcast/mailbox.h"
#include "weight_broadcast/shm_layout.h"

namespace prl {

namespace bip = boost::interprocess;
using weight_broadcast_internal::kNothingPublished;
using weight_broadcast_internal::kShmAlign;
using weight_broadcast_internal::kShmLayoutVersion;
using weight_broadcast_internal::kShmMagic;
using weight_broadcast_internal::ShmFixedHeader;
using weight_broadcast_internal::ShmHeader;
using weight_broadcast_internal::ShmSlot;
using weight_broadcast_internal::WeightMailbox;

namespace weight_broadcast_internal {
// The segment object and its mapping. Mappings are prefaulted (MADV_POPULATE_WRITE /
// _READ): otherwise every version's first pass over a slot takes a fault per 4 KiB page.
struct ShmMapping {
  bip::shared_memory_object shm;
  void* address = nullptr;
  size_t size = 0;

  ShmHeader& header() const { return *static_cast<ShmHeader*>(address); }
  uint8_t* slot(int s) const {
    return static_cast<uint8_t*>(address) + header().fixed.slot_offset[s];
  }

  absl::Status Map(bool writable, bool populate) {
    bip::offset_t bytes = 0;
    shm.get_size(bytes);
    size = static_cast<size_t>(bytes);
    absl::StatusOr<void*> mapped =
        MapShared(shm.get_mapping_handle().handle, size, writable, populate,
                  absl::StrCat("weight segment '", shm.get_name(), "'"));
    if (!mapped.ok()) return mapped.status();
    address = *mapped;
    return absl::OkStatus();
  }
  ~ShmMapping() {
    if (address != nullptr) munmap(address, size);
  }
};
}  // namespace weight_broadcast_internal

using weight_broadcast_internal::ShmMapping;

namespace {

uint64_t AlignUp(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

uint64_t FixedChecksum(const ShmFixedHeader& f) { return XXH3_64bits(&f, sizeof(f)); }

std::string Fingerprint(const ShmFixedHeader& f) {
  return std::string(f.fingerprint, strnlen(f.fingerprint, sizeof(f.fingerprint)));
}

absl::string_view RemoveHint() { return "RemoveShmWeightSegment, or delete /dev/shm/"; }

absl::Status ValidateName(const std::string& name) {
  const bool ok =
      !name.empty() && name.size() <= 200 && std::all_of(name.begin(), name.end(), [](char ch) {
        return std::isalnum(static_cast<unsigned char>(ch)) || ch == '.' || ch == '_' || ch == '-';
      });
  if (ok) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "weight segment name '", name, "': expected 1 to 200 characters of [A-Za-z0-9._-]"));
}

absl::Status Interprocess(const bip::interprocess_exception& e, absl::string_view what,
                          const std::string& name) {
  const std::string message = absl::StrCat(what, " weight segment '", name, "': ", e.what());
  if (e.get_error_code() == bip::not_found_error) return absl::NotFoundError(message);
  if (e.get_error_code() == bip::already_exists_error) return absl::AlreadyExistsError(message);
  if (e.get_error_code() == bip::security_error) return absl::PermissionDeniedError(message);
  return absl::InternalError(message);
}

// Maps an existing segment and checks that its header is one this build can use. Populating
// is for those who copy the slots (not for Inspect).
absl::StatusOr<std::unique_ptr<ShmMapping>> MapExisting(const std::string& name, bool writable,
                                                        bool populate = true) {
  PRL_RETURN_IF_ERROR(ValidateName(name));
  auto m = std::make_unique<ShmMapping>();
  try {
    m->shm = bip::shared_memory_object(bip::open_only, name.c_str(),
                                       writable ? bip::read_write : bip::read_only);
    bip::offset_t size = 0;
    m->shm.get_size(size);
    if (static_cast<uint64_t>(size) < kShmAlign) {
      return absl::UnavailableError(absl::StrCat(
          "weight segment '", name, "' is ", size, " bytes, smaller than its header (", kShmAlign,
          "): being created, or its creator died while creating it (then remove it: ", RemoveHint(),
          name, ")"));
    }
  } catch (const bip::interprocess_exception& e) {
    return Interprocess(e, "cannot open", name);
  }
  PRL_RETURN_IF_ERROR(m->Map(writable, populate));
  const ShmHeader& h = m->header();
  // The creator sets `initialized` last; give a concurrent creator a moment.
  for (int i = 0; i < 100 && h.initialized.load(std::memory_order_acquire) != kShmMagic; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const ShmFixedHeader& f = h.fixed;
  if (f.magic != kShmMagic) {
    return absl::DataLossError(absl::StrCat("'", name, "' is not a prl weight segment (magic ",
                                            absl::Hex(f.magic), ", expected ", absl::Hex(kShmMagic),
                                            "): remove it: ", RemoveHint(), name));
  }
  if (f.layout_version != kShmLayoutVersion) {
    return absl::FailedPreconditionError(absl::StrCat(
        "weight segment '", name, "' has layout version ", f.layout_version, "; this prl reads ",
        kShmLayoutVersion,
        ": restart the publisher with this prl after removing it: ", RemoveHint(), name));
  }
  if (h.fixed_checksum != FixedChecksum(f)) {
    return absl::DataLossError(absl::StrCat("weight segment '", name,
                                            "' has a corrupted header (checksum mismatch): "
                                            "remove it: ",
                                            RemoveHint(), name));
  }
  if (f.segment_bytes != m->size) {
    return absl::DataLossError(absl::StrCat("weight segment '", name, "' is ", m->size,
                                            " bytes but its header says ", f.segment_bytes,
                                            ": remove it: ", RemoveHint(), name));
  }
  if (h.initialized.load(std::memory_order_acquire) != kShmMagic) {
    return absl::UnavailableError(absl::StrCat("weight segment '", name,
                                               "' was never fully created (its creator died "
                                               "while creating it?): remove it: ",
                                               RemoveHint(), name));
  }
  return m;
}

// The segment must hold `config`'s weights.
absl::Status CheckModel(const ShmMapping& m, const std::string& name, const ModelConfig& config) {
  const ShmFixedHeader& f = m.header().fixed;
  PRL_RETURN_IF_ERROR(CheckSameModel(Fingerprint(f), ModelFingerprint(config),
                                     absl::StrCat("weight segment '", name, "'")));
  const uint64_t bytes = static_cast<uint64_t>(ParameterLayout(config).num_elements()) * 4;
  if (f.weight_bytes != bytes) {
    return absl::FailedPreconditionError(absl::StrCat("weight segment '", name, "': slots hold ",
                                                      f.weight_bytes,
                                                      " bytes of weights, this model needs ", bytes,
                                                      " (a prl with another "
                                                      "parameter layout created it?): remove it: ",
                                                      RemoveHint(), name));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<ShmMapping>> CreateNew(const std::string& name,
                                                      const ModelConfig& config) {
  const std::string fingerprint = ModelFingerprint(config);
  ShmFixedHeader f{};
  if (fingerprint.size() >= sizeof(f.fingerprint)) {
    return absl::InvalidArgumentError(absl::StrCat("model fingerprint is ", fingerprint.size(),
                                                   " bytes, the segment header holds ",
                                                   sizeof(f.fingerprint) - 1));
  }
  f.magic = kShmMagic;
  f.layout_version = kShmLayoutVersion;
  f.weight_bytes = static_cast<uint64_t>(ParameterLayout(config).num_elements()) * 4;
  f.slot_offset[0] = kShmAlign;
  f.slot_offset[1] = f.slot_offset[0] + AlignUp(f.weight_bytes, kShmAlign);
  f.segment_bytes = f.slot_offset[1] + AlignUp(f.weight_bytes, kShmAlign);
  f.created_unix_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                          std::chrono::system_clock::now().time_since_epoch())
                          .count();
  std::memcpy(f.fingerprint, fingerprint.data(), fingerprint.size());

  auto m = std::make_unique<ShmMapping>();
  try {
    m->shm = bip::shared_memory_object(bip::create_only, name.c_str(), bip::read_write,
                                       bip::permissions(0600));
    m->shm.truncate(static_cast<bip::offset_t>(f.segment_bytes));
  } catch (const bip::interprocess_exception& e) {
    if (e.get_error_code() != bip::already_exists_error) {
      bip::shared_memory_object::remove(name.c_str());
    }
    return Interprocess(e, "cannot create", name);
  }
  if (absl::Status mapped = m->Map(/*writable=*/true, /*populate=*/true); !mapped.ok()) {
    bip::shared_memory_object::remove(name.c_str());
    return mapped;
  }
  auto* h = new (m->address) ShmHeader();  // the pages are zero; construct the atomics
  h->fixed = f;
  h->fixed_checksum = FixedChecksum(f);
  h->published.store(kNothingPublished, std::memory_order_relaxed);
  h->initialized.store(kShmMagic, std::memory_order_release);
  return m;
}

}  // namespace

// ---- Publisher ----------------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<ShmWeightPublisher>> ShmWeightPublisher::Create(
    const std::string& name, const ModelConfig& config) {
  PRL_RETURN_IF_ERROR(ValidateName(name));
  PRL_RETURN_IF_ERROR(ValidateModelConfig(config));
  absl::StatusOr<std::unique_ptr<ShmMapping>> m = CreateNew(name, config);
  if (m.status().code() == absl::StatusCode::kAlreadyExists) {
    // A restarted publisher: adopt the segment if its publisher is gone and it fits.
    m = MapExisting(name, /*writable=*/true);
    if (m.ok()) PRL_RETURN_IF_ERROR(CheckModel(**m, name, config));
  }
  if (!m.ok()) return m.status();
  ShmHeader& h = (*m)->header();
  for (;;) {  // claim the publisher role from nobody or from a dead process
    uint64_t holder = h.publisher.load(std::memory_order_acquire);
    if (holder != 0 && ProcessAlive(holder)) {
      return absl::AlreadyExistsError(absl::StrCat(
          "weight segment '", name, "' already has a live publisher (pid ", TokenPid(holder),
          "): one learner publishes per segment; stop it, or pick another segment name"));
    }
    if (h.publisher.compare_exchange_strong(holder, SelfProcessToken(),
                                            std::memory_order_acq_rel)) {
      break;
    }
  }
  auto publisher = std::unique_ptr<ShmWeightPublisher>(new ShmWeightPublisher(name, *std::move(m)));
  publisher->fingerprint_ = ModelFingerprint(config);
  publisher->stats_.version_bytes = static_cast<int64_t>(h.fixed.weight_bytes);
  const uint64_t published = h.published.load(std::memory_order_acquire);
  if (published != kNothingPublished) {
    publisher->stats_.last_version = weight_broadcast_internal::PublishedVersion(published);
  }
  return publisher;
}

ShmWeightPublisher::ShmWeightPublisher(std::string name, std::unique_ptr<ShmMapping> m)
    : name_(std::move(name)), mapping_(std::move(m)) {}

ShmWeightPublisher::~ShmWeightPublisher() {
  uint64_t self = SelfProcessToken();
  mapping_->header().publisher.compare_exchange_strong(self, 0, std::memory_order_acq_rel);
}

absl::Status ShmWeightPublisher::Publish(int64_t version, const ParameterSet& weights) {
  const absl::Time start = absl::Now();
  ShmHeader& h = mapping_->header();
  const uint64_t bytes = h.fixed.weight_bytes;
  if (version < 0 || version >= (int64_t{1} << 62)) {
    return absl::InvalidArgumentError(
        absl::StrCat("Publish: version must be in [0, 2^62), found ", version));
  }
  PRL_RETURN_IF_ERROR(CheckSameModel(fingerprint_, ModelFingerprint(weights.config),
                                     absl::StrCat("Publish to weight segment '", name_, "'")));
  if (weights.buffer.bytes() != bytes) {
    return absl::InvalidArgumentError(absl::StrCat("Publish: weights buffer must be ", bytes,
                                                   " bytes, found ", weights.buffer.bytes()));
  }
  const uint64_t newest = h.published.load(std::memory_order_acquire);
  if (newest != kNothingPublished &&
      version <= weight_broadcast_internal::PublishedVersion(newest)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Publish: versions must increase: segment '", name_, "' already holds version ",
        weight_broadcast_internal::PublishedVersion(newest), ", found ", version,
        " (left by an earlier run? subscribers would ignore this version: remove the segment "
        "first with ",
        RemoveHint(), name_, ")"));
  }
  const int s =
      newest == kNothingPublished ? 0 : 1 - weight_broadcast_internal::PublishedSlot(newest);
  ShmSlot& slot = h.slots[s];
  // A slot left odd by a publisher that died mid-write goes to the next odd value as well.
  const uint64_t seq = slot.sequence.load(std::memory_order_relaxed);
  const uint64_t writing = (seq & 1) != 0 ? seq + 2 : seq + 1;
  slot.sequence.store(writing, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  slot.version.store(static_cast<uint64_t>(version), std::memory_order_relaxed);
  PRL_RETURN_IF_ERROR(
      CopyBytes(mapping_->slot(s), Device::Cpu(), weights.data(), weights.buffer.device(), bytes));
  slot.sequence.store(writing + 1, std::memory_order_release);
  h.published.store(weight_broadcast_internal::PackPublished(version, s),
                    std::memory_order_release);
  FutexBumpAndWake(&h.futex);

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
    const std::string& name, const ModelConfig& config, const ShmSubscriberOptions& options) {
  const absl::Time deadline = absl::Now() + options.open_timeout;
  absl::StatusOr<std::unique_ptr<ShmMapping>> m = MapExisting(name, /*writable=*/false);
  while ((m.status().code() == absl::StatusCode::kNotFound ||
          m.status().code() == absl::StatusCode::kUnavailable) &&
         absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(50));
    m = MapExisting(name, /*writable=*/false);
  }
  if (!m.ok()) return m.status();
  PRL_RETURN_IF_ERROR(CheckModel(**m, name, config));
  auto subscriber = std::unique_ptr<ShmWeightSubscriber>(
      new ShmWeightSubscriber(*std::move(m), config, options.device));
  subscriber->receiver_ = std::thread([s = subscriber.get()] { s->ReceiveLoop(); });
  return subscriber;
}

ShmWeightSubscriber::ShmWeightSubscriber(std::unique_ptr<ShmMapping> m, const ModelConfig& config,
                                         Device device)
    : mapping_(std::move(m)), mailbox_(std::make_unique<WeightMailbox>(config, device)) {}

ShmWeightSubscriber::~ShmWeightSubscriber() {
  mailbox_->Close();
  if (receiver_.joinable()) receiver_.join();
}

void ShmWeightSubscriber::ReceiveLoop() {
  // Bounds how long a closed subscriber's receiver sleeps before it notices (the futex lives in
  // a read-only mapping: this side cannot wake itself through it).
  constexpr int64_t kWaitSliceNs = 50'000'000;
  const ShmHeader& h = mapping_->header();
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
    absl::StatusOr<std::shared_ptr<ParameterSet>> dest = mailbox_->AcquireBuffer();
    if (!dest.ok()) {
      mailbox_->Fail(dest.status());
      return;
    }
    const absl::Time start = absl::Now();
    for (;;) {  // seqlock read; see shm_layout.h
      const uint64_t word = h.published.load(std::memory_order_acquire);
      const ShmSlot& slot = h.slots[weight_broadcast_internal::PublishedSlot(word)];
      const uint64_t seq = slot.sequence.load(std::memory_order_acquire);
      const auto version = static_cast<int64_t>(slot.version.load(std::memory_order_relaxed));
      if ((seq & 1) == 0) {
        const absl::Status copied = CopyBytes(
            (*dest)->data(), (*dest)->buffer.device(),
            mapping_->slot(weight_broadcast_internal::PublishedSlot(word)), Device::Cpu(), bytes);
        if (!copied.ok()) {
          mailbox_->Fail(copied);
          return;
        }
        std::atomic_thread_fence(std::memory_order_acquire);
        if (slot.sequence.load(std::memory_order_relaxed) == seq) {
          mailbox_->Deliver(version, *std::move(dest), absl::Now() - start);
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
  PRL_ASSIGN_OR_RETURN(std::unique_ptr<ShmMapping> m,
                       MapExisting(name, /*writable=*/false, /*populate=*/false));
  const ShmHeader& h = m->header();
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
  for (const ShmSlot& slot : h.slots) {
    if ((slot.sequence.load(std::memory_order_acquire) & 1) != 0) info.write_in_progress = true;
  }
  return info;
}

absl::Status RemoveShmWeightSegment(const std::string& name) {
  PRL_RETURN_IF_ERROR(ValidateName(name));
  if (!bip::shared_memory_object::remove(name.c_str())) {
    return absl::NotFoundError(
        absl::StrCat("cannot remove weight segment '", name, "': it does not exist"));
  }
  return absl::OkStatus();
}

}  // namespace prl
