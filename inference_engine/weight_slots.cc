#include "inference_engine/weight_slots.h"

#include <chrono>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "kernels/convert.h"
#if PRL_WITH_CUDA
#include "core/cuda/stream.h"
#endif

namespace prl {

#if PRL_WITH_CUDA
struct WeightSlots::DeviceState {
  // Conversions into the idle copy run on `convert`, each recorded in `converted`; `idle_free`
  // follows the last step queued on the copy that became idle.
  cuda::Stream convert;
  cuda::Event converted, idle_free;
};
#else
struct WeightSlots::DeviceState {};
#endif

namespace {
double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// dst (the copy's buffer, in `dtype`) = the F32 weights of `src`, on the current stream.
void Convert(ComputeParams& dst, const ParameterSet& src, DType dtype, Device device) {
  const int64_t n = src.layout.num_elements();
  kernels::ConvertDType(Tensor(dst.buffer.data(), dtype, device, {n}),
                        Tensor(const_cast<float*>(src.data()), DType::kF32, device, {n}));
}
}  // namespace

WeightSlots::WeightSlots(std::shared_ptr<const ParameterSet> weights, int64_t version,
                         const WeightSlotsOptions& options)
    : options_(options),
      num_elements_(weights->layout.num_elements()),
      weights_(std::move(weights)),
      version_(version) {}

absl::StatusOr<std::unique_ptr<WeightSlots>> WeightSlots::Create(
    std::shared_ptr<const ParameterSet> weights, int64_t version,
    const WeightSlotsOptions& options) {
  auto slots = std::unique_ptr<WeightSlots>(new WeightSlots(std::move(weights), version, options));
  if (!options.device.is_cuda()) return slots;
#if PRL_WITH_CUDA
  if (options.double_buffered) {
    const int device = options.device.index;
    PRL_ASSIGN_OR_RETURN(cuda::Stream convert, cuda::Stream::Create(device));
    PRL_ASSIGN_OR_RETURN(cuda::Event converted, cuda::Event::Create(device));
    PRL_ASSIGN_OR_RETURN(cuda::Event idle_free, cuda::Event::Create(device));
    slots->device_state_ = std::make_unique<DeviceState>(
        DeviceState{std::move(convert), std::move(converted), std::move(idle_free)});
  }
#endif
  PRL_ASSIGN_OR_RETURN(slots->compute_, ToComputeDType(*slots->weights_, options.dtype));
  if (options.double_buffered) {
    PRL_ASSIGN_OR_RETURN(slots->spare_, ToComputeDType(*slots->weights_, options.dtype));
  }
  return slots;
}

WeightSlots::~WeightSlots() {
#if PRL_WITH_CUDA
  if (device_state_ != nullptr) (void)device_state_->convert.Synchronize();
#endif
}

const ModelParams& WeightSlots::active() const {
  if (spare_active_) return spare_->params;
  return compute_.has_value() ? compute_->params : weights_->params;
}

std::vector<const ModelParams*> WeightSlots::copies() const {
  if (!spare_.has_value()) return {};
  return {&compute_->params, &spare_->params};
}

absl::Status WeightSlots::Stage(std::shared_ptr<const ParameterSet> weights, int64_t version) {
  // num_elements_, not weights_: the stepping thread may be flipping weights_ right now.
  if (weights == nullptr || weights->layout.num_elements() != num_elements_ ||
      weights->buffer.device() != options_.device) {
    return absl::InvalidArgumentError(
        absl::StrCat("SwapWeights: expected ", num_elements_, " weights on ",
                     options_.device.ToString(), ", found ",
                     weights == nullptr ? std::string("none")
                                        : absl::StrCat(weights->layout.num_elements(), " on ",
                                                       weights->buffer.device().ToString())));
  }
  std::lock_guard<std::mutex> lock(mutex_);
  pending_weights_ = std::move(weights);
  pending_version_ = version;
  return absl::OkStatus();
}

void WeightSlots::StageAdapter(std::shared_ptr<const LoraSet> adapter, int64_t version) {
  std::lock_guard<std::mutex> lock(mutex_);
  pending_adapter_ = std::move(adapter);
  pending_adapter_version_ = version;
}

absl::Status WeightSlots::ApplyAtStepStart(StepTransfer& io, bool* swapped) {
  *swapped = false;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    if (pending_adapter_version_) {
      const auto start = std::chrono::steady_clock::now();
      adapter_ = std::move(pending_adapter_);  // the pointer flip
      version_ = *pending_adapter_version_;
      pending_adapter_version_.reset();
      lock.unlock();
      Flipped(start, swapped);
    }
  }
  if (spare_.has_value()) return ApplyDoubleBuffered(swapped);
  return ApplyOneCopy(io, swapped);
}

absl::Status WeightSlots::ApplyOneCopy(StepTransfer& io, bool* swapped) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!pending_version_) return absl::OkStatus();
    weights_ = std::move(pending_weights_);  // the pointer flip
    version_ = *pending_version_;
    pending_version_.reset();
  }
  const auto start = std::chrono::steady_clock::now();
  if (compute_.has_value()) {
    // Into the buffers the captured graphs read: a device copy (and conversion), no recapture.
    Convert(*compute_, *weights_, options_.dtype, options_.device);
    PRL_RETURN_IF_ERROR(io.Finish());  // measured: wait for the copy
  }
  Flipped(start, swapped);
  return absl::OkStatus();
}

void WeightSlots::Flipped(std::chrono::steady_clock::time_point start, bool* swapped) {
  swap_seconds_ += SecondsSince(start);
  ++swaps_;
  *swapped = true;
}

absl::Status WeightSlots::ApplyDoubleBuffered(bool* swapped) {
#if PRL_WITH_CUDA
  DeviceState& d = *device_state_;
  const int device = options_.device.index;
  const auto start = std::chrono::steady_clock::now();
  if (converting_version_.has_value()) {
    PRL_ASSIGN_OR_RETURN(const bool converted, d.converted.Done());
    if (!converted) return absl::OkStatus();  // this step runs on the weights in use
    spare_active_ = !spare_active_;
    weights_ = std::move(converting_weights_);
    version_ = *converting_version_;
    converting_version_.reset();
    // Every step that reads the copy now idle is queued before this point of the Step's stream.
    PRL_RETURN_IF_ERROR(d.idle_free.Record(cuda::CurrentStream(device)));
    Flipped(start, swapped);
  }
  std::shared_ptr<const ParameterSet> next;
  int64_t version = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!pending_version_) return absl::OkStatus();
    next = std::move(pending_weights_);
    version = *pending_version_;
    pending_version_.reset();
  }
  const auto launch = std::chrono::steady_clock::now();
  PRL_RETURN_IF_ERROR(d.convert.Wait(d.idle_free));
  {
    cuda::StreamGuard guard(device, d.convert.get());
    Convert(spare_active_ ? *compute_ : *spare_, *next, options_.dtype, options_.device);
  }
  PRL_RETURN_IF_ERROR(d.converted.Record(d.convert.get()));
  converting_weights_ = std::move(next);  // kept alive until the flip
  converting_version_ = version;
  swap_seconds_ += SecondsSince(launch);
  return absl::OkStatus();
#else
  (void)swapped;
  return absl::InternalError("engine: double-buffered weights need the CUDA build");
#endif
}

}  // namespace prl
