#include "weight_broadcast/cuda_ipc_control.h"

#include <chrono>
#include <cstring>
#include <new>
#include <thread>

#include "absl/strings/str_cat.h"
#include "core/futex.h"
#include "core/process_identity.h"
#include "core/status_macros.h"
#include "core/xxhash_inline.h"
#include "weight_broadcast/shm_segment.h"
#include "weight_broadcast/weight_transport.h"

namespace prl::weight_broadcast_internal {

namespace {

constexpr SegmentKind kCudaIpcKind = {"CUDA IPC weight segment",
                                      "RemoveCudaIpcWeightSegment, or delete /dev/shm/",
                                      kCudaIpcMagic, kCudaIpcLayoutVersion, kCudaIpcSegmentBytes};

CudaIpcHeader& HeaderOf(const SharedSegment& s) {
  return *static_cast<CudaIpcHeader*>(s.address());
}

uint64_t FixedChecksum(const CudaIpcFixedHeader& f) { return XXH3_64bits(&f, sizeof(f)); }

// Maps an existing segment (writable: subscribers count themselves in `readers`) and checks
// that its header is one this build can use.
absl::StatusOr<std::unique_ptr<SharedSegment>> MapExisting(const std::string& name) {
  PRL_ASSIGN_OR_RETURN(
      std::unique_ptr<SharedSegment> s,
      SharedSegment::Open(name, /*writable=*/true, /*populate=*/true, kCudaIpcKind));
  const CudaIpcHeader& h = HeaderOf(*s);
  WaitUntilInitialized(h.initialized, kCudaIpcMagic);
  SegmentPreamble p;
  p.magic = h.fixed.magic;
  p.layout_version = h.fixed.layout_version;
  p.segment_bytes = h.fixed.segment_bytes;
  p.checksum_ok = h.fixed_checksum == FixedChecksum(h.fixed);
  p.initialized = h.initialized.load(std::memory_order_acquire) == kCudaIpcMagic;
  PRL_RETURN_IF_ERROR(CheckPreamble(p, s->size(), name, kCudaIpcKind));
  return s;
}

absl::StatusOr<std::unique_ptr<SharedSegment>> CreateNew(const std::string& name,
                                                         const WeightSpec& spec) {
  const std::string fingerprint = WeightFingerprint(spec);
  CudaIpcFixedHeader f{};
  if (fingerprint.size() >= sizeof(f.fingerprint)) {
    return absl::InvalidArgumentError(absl::StrCat("model fingerprint is ", fingerprint.size(),
                                                   " bytes, the segment header holds ",
                                                   sizeof(f.fingerprint) - 1));
  }
  f.magic = kCudaIpcMagic;
  f.layout_version = kCudaIpcLayoutVersion;
  f.segment_bytes = kCudaIpcSegmentBytes;
  f.weight_bytes = static_cast<uint64_t>(WeightBytes(spec));
  f.created_unix_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                          std::chrono::system_clock::now().time_since_epoch())
                          .count();
  std::memcpy(f.fingerprint, fingerprint.data(), fingerprint.size());
  PRL_ASSIGN_OR_RETURN(std::unique_ptr<SharedSegment> s,
                       SharedSegment::Create(name, f.segment_bytes, kCudaIpcKind));
  auto* h = new (s->address()) CudaIpcHeader();  // the pages are zero; construct the atomics
  h->fixed = f;
  h->fixed_checksum = FixedChecksum(f);
  h->published.store(kNothingPublished, std::memory_order_relaxed);
  h->initialized.store(kCudaIpcMagic, std::memory_order_release);
  return s;
}

std::string Where(const std::string& name) {
  return absl::StrCat("CUDA IPC weight segment '", name, "'");
}

}  // namespace

WeightHandshake CudaIpcSegmentHandshake(const CudaIpcHeader& header) {
  WeightHandshake h;
  h.transport = "cuda_ipc";
  h.model_fingerprint =
      std::string(header.fixed.fingerprint,
                  strnlen(header.fixed.fingerprint, sizeof(header.fixed.fingerprint)));
  h.weight_bytes = static_cast<int64_t>(header.fixed.weight_bytes);
  return h;
}

absl::StatusOr<std::unique_ptr<CudaIpcControl>> CudaIpcControl::Attach(const std::string& name,
                                                                       const WeightSpec& spec) {
  PRL_RETURN_IF_ERROR(ValidateSegmentName(name, kCudaIpcKind));
  PRL_RETURN_IF_ERROR(ValidateWeightSpec(spec));
  absl::StatusOr<std::unique_ptr<SharedSegment>> s = CreateNew(name, spec);
  if (s.status().code() == absl::StatusCode::kAlreadyExists) {
    // A restarted publisher: adopt the segment if its publisher is gone and it fits.
    s = MapExisting(name);
    if (s.ok()) {
      PRL_RETURN_IF_ERROR(CheckHandshake(CudaIpcSegmentHandshake(HeaderOf(**s)),
                                         LocalHandshake("cuda_ipc", spec), Where(name)));
    }
  }
  if (!s.ok()) return s.status();
  PRL_RETURN_IF_ERROR(ClaimPublisher(HeaderOf(**s).publisher, name, kCudaIpcKind));
  auto control = std::unique_ptr<CudaIpcControl>(new CudaIpcControl(*std::move(s), true));
  return control;
}

absl::StatusOr<std::unique_ptr<CudaIpcControl>> CudaIpcControl::Open(const std::string& name,
                                                                     const WeightSpec& spec,
                                                                     absl::Duration open_timeout) {
  const absl::Time deadline = absl::Now() + open_timeout;
  absl::StatusOr<std::unique_ptr<SharedSegment>> s = MapExisting(name);
  while ((absl::IsNotFound(s.status()) || absl::IsUnavailable(s.status())) &&
         absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(50));
    s = MapExisting(name);
  }
  if (!s.ok()) return s.status();
  PRL_RETURN_IF_ERROR(CheckHandshake(CudaIpcSegmentHandshake(HeaderOf(**s)),
                                     LocalHandshake("cuda_ipc", spec), Where(name)));
  return std::unique_ptr<CudaIpcControl>(new CudaIpcControl(*std::move(s), false));
}

CudaIpcControl::CudaIpcControl(std::unique_ptr<SharedSegment> segment, bool publisher)
    : segment_(std::move(segment)), attached_(publisher) {}

CudaIpcControl::~CudaIpcControl() { Detach(absl::ZeroDuration()); }

const std::string& CudaIpcControl::name() const { return segment_->name(); }
const CudaIpcHeader& CudaIpcControl::header() const { return HeaderOf(*segment_); }
CudaIpcHeader& CudaIpcControl::mutable_header() const { return HeaderOf(*segment_); }
int64_t CudaIpcControl::weight_bytes() const {
  return static_cast<int64_t>(header().fixed.weight_bytes);
}

int64_t CudaIpcControl::held_version() const {
  const uint64_t word = header().published.load(std::memory_order_acquire);
  return word == kNothingPublished ? -1 : PublishedVersion(word);
}

CudaIpcControl::Write CudaIpcControl::BeginWrite(int64_t version,
                                                 const std::array<IpcHandle, 2>& handles) {
  CudaIpcHeader& h = mutable_header();
  Write w;
  w.slot = SlotToWrite(h.published.load(std::memory_order_acquire));
  w.version = version;
  CudaIpcSlot& slot = h.slots[w.slot];
  w.sequence = BeginSlotWrite(slot.lock, version);
  const Owner self = attached();
  slot.publisher.store(self.publisher, std::memory_order_relaxed);
  slot.generation.store(self.generation, std::memory_order_relaxed);
  std::memcpy(slot.handle, handles[w.slot].data(), kIpcHandleBytes);
  return w;
}

void CudaIpcControl::EndWrite(const Write& w) {
  CudaIpcHeader& h = mutable_header();
  EndSlotWrite(h.slots[w.slot].lock, w.sequence, h.published, w.version, w.slot);
  FutexBumpAndWake(&h.futex);
}

bool CudaIpcControl::Detach(absl::Duration drain) {
  if (!attached_) return true;
  attached_ = false;
  CudaIpcHeader& h = mutable_header();
  // Sequentially consistent against EnterReader: either a reader sees the role given up, or
  // this side sees the reader. The generation moves on so that no later publisher of this
  // process owns the slots written so far.
  uint64_t self = SelfProcessToken();
  h.publisher.compare_exchange_strong(self, 0, std::memory_order_seq_cst);
  h.generation.fetch_add(1, std::memory_order_seq_cst);
  FutexBumpAndWake(&h.futex);
  const absl::Time deadline = absl::Now() + drain;
  while (h.readers.load(std::memory_order_seq_cst) != 0) {
    if (absl::Now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

CudaIpcControl::ReadState CudaIpcControl::BeginRead(SlotView* view) const {
  const CudaIpcHeader& h = header();
  if (h.published.load(std::memory_order_acquire) == kNothingPublished) return ReadState::kNothing;
  const std::optional<SlotRead> r = BeginSlotRead(h.published, h.slots[0].lock, h.slots[1].lock);
  if (!r.has_value()) return ReadState::kBusy;
  const CudaIpcSlot& slot = h.slots[r->slot];
  view->read = *r;
  view->owner.publisher = slot.publisher.load(std::memory_order_relaxed);
  view->owner.generation = slot.generation.load(std::memory_order_relaxed);
  std::memcpy(view->handle.data(), slot.handle, kIpcHandleBytes);
  if (!SlotReadValid(slot.lock, *r)) return ReadState::kBusy;
  if (view->owner.publisher == 0 || view->owner != attached() ||
      !ProcessAlive(view->owner.publisher)) {
    return ReadState::kStale;
  }
  return ReadState::kReady;
}

bool CudaIpcControl::EnterReader(const Owner& owner) {
  CudaIpcHeader& h = mutable_header();
  h.readers.fetch_add(1, std::memory_order_seq_cst);
  if (attached() == owner) return true;
  h.readers.fetch_sub(1, std::memory_order_seq_cst);
  return false;
}

void CudaIpcControl::LeaveReader() {
  mutable_header().readers.fetch_sub(1, std::memory_order_seq_cst);
}

bool CudaIpcControl::EndRead(const SlotView& view) const {
  return SlotReadValid(header().slots[view.read.slot].lock, view.read) &&
         attached() == view.owner && ProcessAlive(view.owner.publisher);
}

CudaIpcControl::Owner CudaIpcControl::attached() const {
  const CudaIpcHeader& h = header();
  Owner o;
  o.publisher = h.publisher.load(std::memory_order_seq_cst);
  o.generation = h.generation.load(std::memory_order_seq_cst);
  return o;
}

uint32_t CudaIpcControl::futex_value() const {
  return header().futex.load(std::memory_order_acquire);
}

void CudaIpcControl::WaitForChange(uint32_t seen, int64_t timeout_ns) const {
  FutexWait(&mutable_header().futex, seen, timeout_ns);
}

absl::StatusOr<CudaIpcSegmentInfo> InspectCudaIpcSegment(const std::string& name) {
  PRL_ASSIGN_OR_RETURN(std::unique_ptr<SharedSegment> s, MapExisting(name));
  const CudaIpcHeader& h = HeaderOf(*s);
  CudaIpcSegmentInfo info;
  info.weight_bytes = static_cast<int64_t>(h.fixed.weight_bytes);
  info.model_fingerprint = CudaIpcSegmentHandshake(h).model_fingerprint;
  const uint64_t word = h.published.load(std::memory_order_acquire);
  if (word != kNothingPublished) info.newest_version = PublishedVersion(word);
  const ProcessToken publisher = h.publisher.load(std::memory_order_acquire);
  info.publisher_pid = publisher == 0 ? 0 : TokenPid(publisher);
  info.publisher_alive = publisher != 0 && ProcessAlive(publisher);
  info.readers = static_cast<int64_t>(h.readers.load(std::memory_order_acquire));
  return info;
}

absl::Status RemoveCudaIpcSegment(const std::string& name) {
  return RemoveSegment(name, kCudaIpcKind);
}

}  // namespace prl::weight_broadcast_internal
