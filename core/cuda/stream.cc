// Streams, events and the per-thread current stream (core/cuda/stream.h).
#include "core/cuda/stream.h"

#include <utility>

#include "core/cuda/cuda_check.h"

namespace prl::cuda {
namespace {

// The calling thread's current stream per device; `set` false means the default
// (cudaStreamPerThread), so that the legacy stream (nullptr) can itself be made current.
struct CurrentSlot {
  bool set = false;
  cudaStream_t stream = nullptr;
};
thread_local CurrentSlot current[kMaxDevices];

CurrentSlot& Slot(int device) {
  PRL_CHECK(device >= 0 && device < kMaxDevices, "CUDA device index out of range: ", device);
  return current[device];
}

}  // namespace

cudaStream_t CurrentStream(int device) {
  const CurrentSlot& slot = Slot(device);
  return slot.set ? slot.stream : cudaStreamPerThread;
}

StreamGuard::StreamGuard(int device, cudaStream_t stream) : device_(device) {
  CurrentSlot& slot = Slot(device);
  had_previous_ = slot.set;
  previous_ = slot.stream;
  slot = {true, stream};
}

StreamGuard::~StreamGuard() { current[device_] = {had_previous_, previous_}; }

// --- Stream ------------------------------------------------------------------------------

absl::StatusOr<Stream> Stream::Create(int device, int priority) {
  PRL_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  Stream s;
  PRL_CUDA_RETURN_IF_ERROR(
      cudaStreamCreateWithPriority(&s.stream_, cudaStreamNonBlocking, priority));
  s.device_ = device;
  return s;
}

Stream::Stream(Stream&& other) noexcept
    : device_(std::exchange(other.device_, -1)), stream_(std::exchange(other.stream_, nullptr)) {}

Stream& Stream::operator=(Stream&& other) noexcept {
  if (this != &other) {
    Release();
    device_ = std::exchange(other.device_, -1);
    stream_ = std::exchange(other.stream_, nullptr);
  }
  return *this;
}

Stream::~Stream() { Release(); }

void Stream::Release() {
  if (stream_ == nullptr) return;
  // Destroying a stream with queued work is allowed: the runtime releases it once done.
  cudaStreamDestroy(stream_);
  stream_ = nullptr;
}

absl::Status Stream::Synchronize() const {
  PRL_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  return absl::OkStatus();
}

absl::Status Stream::Wait(const Event& event) const {
  PRL_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream_, event.get(), 0));
  return absl::OkStatus();
}

// --- Event -------------------------------------------------------------------------------

absl::StatusOr<Event> Event::Create(int device, bool timing) {
  PRL_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  Event e;
  PRL_CUDA_RETURN_IF_ERROR(
      cudaEventCreateWithFlags(&e.event_, timing ? cudaEventDefault : cudaEventDisableTiming));
  e.device_ = device;
  return e;
}

Event::Event(Event&& other) noexcept
    : device_(std::exchange(other.device_, -1)), event_(std::exchange(other.event_, nullptr)) {}

Event& Event::operator=(Event&& other) noexcept {
  if (this != &other) {
    Release();
    device_ = std::exchange(other.device_, -1);
    event_ = std::exchange(other.event_, nullptr);
  }
  return *this;
}

Event::~Event() { Release(); }

void Event::Release() {
  if (event_ == nullptr) return;
  cudaEventDestroy(event_);
  event_ = nullptr;
}

absl::Status Event::Record(cudaStream_t stream) {
  PRL_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  PRL_CUDA_RETURN_IF_ERROR(cudaEventRecord(event_, stream));
  return absl::OkStatus();
}

absl::Status Event::Synchronize() const {
  PRL_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(event_));
  return absl::OkStatus();
}

absl::StatusOr<bool> Event::Done() const {
  const cudaError_t err = cudaEventQuery(event_);
  if (err == cudaErrorNotReady) {
    cudaGetLastError();  // cudaErrorNotReady is not sticky, but keep the error slot clean
    return false;
  }
  PRL_CUDA_RETURN_IF_ERROR(err);
  return true;
}

absl::StatusOr<float> Event::ElapsedMs(const Event& start, const Event& end) {
  float ms = 0;
  PRL_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, start.event_, end.event_));
  return ms;
}

}  // namespace prl::cuda
