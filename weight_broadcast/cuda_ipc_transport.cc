#include "weight_broadcast/cuda_ipc_transport.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "core/cuda_runtime.h"
#include "core/status_macros.h"
#include "weight_broadcast/cuda_ipc_control.h"
#include "weight_broadcast/cuda_ipc_memory.h"
#include "weight_broadcast/mailbox.h"

namespace prl {

using weight_broadcast_internal::CudaIpcControl;
using weight_broadcast_internal::ExportedBuffer;
using weight_broadcast_internal::ImportedBuffer;
using weight_broadcast_internal::IpcHandle;
using weight_broadcast_internal::WeightMailbox;
using weight_broadcast_internal::WeightBuffer;

namespace {

// Bounds how long a closed subscriber's receiver sleeps before it notices, and how soon it
// drops the mappings of a publisher that went away.
constexpr int64_t kWaitSliceNs = 50'000'000;

// The transport needs this build's CUDA runtime and `device`, a CUDA GPU of this machine.
absl::Status CheckCudaDevice(Device device, absl::string_view field) {
  if (!weight_broadcast_internal::CudaIpcCompiled()) {
    return absl::UnimplementedError(
        "prl was built without CUDA (PRL_CUDA=OFF or no toolkit): the cuda_ipc weight transport "
        "is unavailable (use shm on one node)");
  }
  if (!device.is_cuda()) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, " is ", device.ToString(),
        ": the cuda_ipc transport moves weights between CUDA devices (use shm for the CPU)"));
  }
  const int gpus = cuda::DeviceCount();
  if (device.index < 0 || device.index >= gpus) {
    return absl::FailedPreconditionError(absl::StrCat(
        field, " is ", device.ToString(), " but this machine has ", gpus,
        " usable CUDA GPU(s) (no driver or no device?): the cuda_ipc transport needs one"));
  }
  return absl::OkStatus();
}

}  // namespace

// ---- Publisher ----------------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<CudaIpcWeightPublisher>> CudaIpcWeightPublisher::Create(
    const std::string& name, const WeightSpec& spec, const CudaIpcPublisherOptions& options) {
  PRL_RETURN_IF_ERROR(CheckCudaDevice(options.device, "CudaIpcPublisherOptions.device"));
  PRL_RETURN_IF_ERROR(ValidateWeightSpec(spec));
  auto publisher =
      std::unique_ptr<CudaIpcWeightPublisher>(new CudaIpcWeightPublisher(name, options));
  publisher->handshake_ = LocalHandshake("cuda_ipc", spec);
  PRL_ASSIGN_OR_RETURN(publisher->control_, CudaIpcControl::Attach(name, spec));
  const auto bytes = static_cast<size_t>(publisher->handshake_.weight_bytes);
  for (auto& buffer : publisher->buffers_) {
    PRL_ASSIGN_OR_RETURN(buffer, ExportedBuffer::Allocate(options.device, bytes));
  }
  publisher->stats_.version_bytes = publisher->handshake_.weight_bytes;
  if (const int64_t held = publisher->control_->held_version(); held >= 0) {
    publisher->versions_.Held(held);
    publisher->stats_.last_version = held;
  }
  return publisher;
}

CudaIpcWeightPublisher::CudaIpcWeightPublisher(std::string name,
                                               const CudaIpcPublisherOptions& options)
    : name_(std::move(name)), options_(options) {}

CudaIpcWeightPublisher::~CudaIpcWeightPublisher() {
  // Subscribers stop reading before the buffers go (CudaIpcControl::Detach).
  if (control_ != nullptr) control_->Detach(options_.drain_timeout);
  for (auto& buffer : buffers_) buffer.reset();
}

absl::Status CudaIpcWeightPublisher::PublishWeights(int64_t version, const WeightView& weights) {
  const absl::Time start = absl::Now();
  const std::string where = absl::StrCat("Publish to CUDA IPC weight segment '", name_, "'");
  PRL_RETURN_IF_ERROR(versions_.CheckNext(
      version, where,
      absl::StrCat(" (a restarted learner resumes above newest_version(); to start over, remove "
                   "the segment first with RemoveCudaIpcWeightSegment)")));
  PRL_RETURN_IF_ERROR(CheckPublishedWeights(handshake_, weights, where));
  const std::array<IpcHandle, 2> handles = {buffers_[0]->handle(), buffers_[1]->handle()};
  const CudaIpcControl::Write write = control_->BeginWrite(version, handles);
  // Synchronous: the bytes have landed before the slot is marked complete. On an error the slot
  // stays odd, as if this publisher had died mid-write: readers keep the other one.
  PRL_RETURN_IF_ERROR(CopyBytes(buffers_[write.slot]->data(), options_.device, weights.data,
                                weights.device, weights.bytes));
  control_->EndWrite(write);
  versions_.Published(version);

  std::lock_guard<std::mutex> lock(stats_mu_);
  stats_.versions_published += 1;
  stats_.last_version = version;
  stats_.last_publish_seconds = absl::ToDoubleSeconds(absl::Now() - start);
  stats_.total_publish_seconds += stats_.last_publish_seconds;
  return absl::OkStatus();
}

PublisherStats CudaIpcWeightPublisher::stats() const {
  std::lock_guard<std::mutex> lock(stats_mu_);
  return stats_;
}

// ---- Subscriber ---------------------------------------------------------------------------

// The receiver thread's state: the control segment and the mappings of the attached
// publisher's buffers (one per slot, opened on first use, dropped when the owner changes).
class CudaIpcWeightSubscriber::Receiver {
 public:
  Receiver(std::unique_ptr<CudaIpcControl> control, Device device, WeightMailbox* mailbox)
      : control_(std::move(control)), device_(device), mailbox_(mailbox) {}

  void Loop();

 private:
  enum class Outcome { kDelivered, kRetry, kWait, kFailed };
  // One attempt at the newest version into `dest`.
  Outcome ReceiveInto(WeightBuffer& dest, absl::Time start);
  // The mapping of `view`'s buffer, opening it if needed.
  absl::StatusOr<const ImportedBuffer*> Mapping(const CudaIpcControl::SlotView& view);
  void DropMappings() {
    for (auto& m : mapped_) m.reset();
    mapped_owner_ = {};
  }

  std::unique_ptr<CudaIpcControl> control_;
  const Device device_;
  WeightMailbox* mailbox_;
  CudaIpcControl::Owner mapped_owner_;  // whose buffers mapped_ holds
  std::unique_ptr<ImportedBuffer> mapped_[2];
};

void CudaIpcWeightSubscriber::Receiver::Loop() {
  WeightBuffer dest;
  while (!mailbox_->closed()) {
    const uint32_t seen = control_->futex_value();
    // Never keep mappings of a publisher that detached or died: its buffers are (being) freed.
    if (mapped_owner_.publisher != 0 && mapped_owner_ != control_->attached()) DropMappings();
    if (control_->held_version() <= mailbox_->last_version()) {
      control_->WaitForChange(seen, kWaitSliceNs);
      continue;
    }
    if (dest.empty()) {
      absl::StatusOr<WeightBuffer> acquired = mailbox_->AcquireBuffer();
      if (!acquired.ok()) {
        mailbox_->Fail(acquired.status());
        return;
      }
      dest = *std::move(acquired);
    }
    switch (ReceiveInto(dest, absl::Now())) {
      case Outcome::kDelivered:
        break;
      case Outcome::kRetry:  // lapped, or the slot was being written
        mailbox_->NoteRetry();
        break;
      case Outcome::kWait:  // the newest version's publisher is gone: wait for the next one
        control_->WaitForChange(seen, kWaitSliceNs);
        break;
      case Outcome::kFailed:
        return;
    }
  }
}

CudaIpcWeightSubscriber::Receiver::Outcome CudaIpcWeightSubscriber::Receiver::ReceiveInto(
    WeightBuffer& dest, absl::Time start) {
  CudaIpcControl::SlotView view;
  switch (control_->BeginRead(&view)) {
    case CudaIpcControl::ReadState::kNothing:
    case CudaIpcControl::ReadState::kStale:
      return Outcome::kWait;
    case CudaIpcControl::ReadState::kBusy:
      return Outcome::kRetry;
    case CudaIpcControl::ReadState::kReady:
      break;
  }
  if (view.read.version <= mailbox_->last_version()) return Outcome::kWait;
  absl::StatusOr<const ImportedBuffer*> source = Mapping(view);
  if (!source.ok()) {  // the publisher went away between the checks and the mapping
    mailbox_->NoteReconnect(source.status());
    return Outcome::kWait;
  }
  if (!control_->EnterReader(view.owner)) return Outcome::kWait;
  const absl::Status copied = CopyBytes(dest.data(), device_, (*source)->data(), device_,
                                        static_cast<size_t>(control_->weight_bytes()));
  const bool intact = control_->EndRead(view);
  control_->LeaveReader();
  if (!copied.ok()) {
    if (!intact) {  // the publisher died under the copy: its memory went with it
      mailbox_->NoteReconnect(copied);
      return Outcome::kWait;
    }
    mailbox_->Fail(copied);
    return Outcome::kFailed;
  }
  if (!intact) return Outcome::kRetry;
  mailbox_->Deliver(view.read.version, std::move(dest), absl::Now() - start);
  dest = {};
  return Outcome::kDelivered;
}

absl::StatusOr<const ImportedBuffer*> CudaIpcWeightSubscriber::Receiver::Mapping(
    const CudaIpcControl::SlotView& view) {
  if (view.owner != mapped_owner_) {
    DropMappings();
    mapped_owner_ = view.owner;
  }
  std::unique_ptr<ImportedBuffer>& mapped = mapped_[view.read.slot];
  if (mapped == nullptr || mapped->handle() != view.handle) {
    mapped.reset();
    PRL_ASSIGN_OR_RETURN(mapped, ImportedBuffer::Open(view.handle, device_));
  }
  return mapped.get();
}

absl::StatusOr<std::unique_ptr<CudaIpcWeightSubscriber>> CudaIpcWeightSubscriber::Open(
    const std::string& name, const WeightSpec& spec, const CudaIpcSubscriberOptions& options) {
  PRL_RETURN_IF_ERROR(CheckCudaDevice(options.device, "CudaIpcSubscriberOptions.device"));
  PRL_RETURN_IF_ERROR(ValidateWeightSpec(spec));
  PRL_ASSIGN_OR_RETURN(std::unique_ptr<CudaIpcControl> control,
                       CudaIpcControl::Open(name, spec, options.open_timeout));
  auto subscriber = std::unique_ptr<CudaIpcWeightSubscriber>(new CudaIpcWeightSubscriber());
  subscriber->mailbox_ = std::make_unique<WeightMailbox>(spec, options.device);
  subscriber->receiver_ =
      std::make_unique<Receiver>(std::move(control), options.device, subscriber->mailbox_.get());
  subscriber->thread_ = std::thread([r = subscriber->receiver_.get()] { r->Loop(); });
  return subscriber;
}

CudaIpcWeightSubscriber::~CudaIpcWeightSubscriber() {
  mailbox_->Close();
  if (thread_.joinable()) thread_.join();
}

absl::StatusOr<std::optional<VersionedWeights>> CudaIpcWeightSubscriber::TakeNewer(int64_t have) {
  return mailbox_->TakeNewer(have);
}

absl::StatusOr<VersionedWeights> CudaIpcWeightSubscriber::WaitNewer(int64_t have,
                                                                    absl::Duration timeout) {
  return mailbox_->WaitNewer(have, timeout);
}

SubscriberStats CudaIpcWeightSubscriber::stats() const { return mailbox_->stats(); }

absl::Status RemoveCudaIpcWeightSegment(const std::string& name) {
  return weight_broadcast_internal::RemoveCudaIpcSegment(name);
}

}  // namespace prl
