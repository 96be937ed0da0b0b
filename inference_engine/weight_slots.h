// WeightSlots: the engine's weights, their version, and the swaps from one version to the next.
//
// SwapWeights' other half. Stage (any thread, non-blocking) puts new weights aside; the
// stepping thread applies them with ApplyAtStepStart at the start of a Step, on the Step's
// stream. What the model runs on (active()) depends on the device:
//
//   CPU            the staged ParameterSet itself: the swap is a pointer flip.
//   CUDA, one copy the engine's copy in the compute dtype, which the captured CUDA graphs read:
//                  the Step after Stage converts the staged weights into it and waits for the
//                  conversion before it runs.
//   CUDA, double-  two such copies; copies() are the views the graphs are captured for. A Step
//   buffered       that finds staged weights starts converting them into the idle copy on a
//                  side stream (after the last step queued on that copy) and runs on the copy
//                  in use; the first Step after the conversion finished flips to the other copy.
//                  A Stage during a conversion waits its turn: the conversion runs to its end,
//                  is flipped to, and the newest staged weights are converted next.
//
// A swap only changes which weights the next steps read; what else it implies (the prefix
// cache, recomputing KV) is the engine's. Invariants: version() is the version of active(); a
// ParameterSet is kept alive while a conversion reads it.
//
// Thread-safety: Stage from any thread; everything else from the stepping thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "inference_engine/step_transfer.h"
#include "model/lora.h"
#include "model/parameters.h"

namespace prl {

struct WeightSlotsOptions {
  Device device = Device::Cpu();
  DType dtype = DType::kF32;    // CUDA: the copies' compute dtype
  bool double_buffered = true;  // CUDA: two copies (EngineOptions::double_buffered_weights)
};

class WeightSlots {
 public:
  // `weights` on options.device (checked by the engine). On CUDA converts them into the copies
  // on the calling thread's current stream; the caller synchronises before their first use.
  static absl::StatusOr<std::unique_ptr<WeightSlots>> Create(
      std::shared_ptr<const ParameterSet> weights, int64_t version,
      const WeightSlotsOptions& options);
  ~WeightSlots();  // waits for a conversion in flight
  WeightSlots(const WeightSlots&) = delete;
  WeightSlots& operator=(const WeightSlots&) = delete;

  // Stages weights of the same size and device for the next Step, replacing weights staged
  // before and not yet applied. The error names the expected and the found size.
  absl::Status Stage(std::shared_ptr<const ParameterSet> weights, int64_t version);

  // At a Step's start, on its stream: flips to weights staged (one copy, CPU) or converted
  // (double-buffered), and starts the next conversion. `io`: the Step's transfer, on which a
  // one-copy swap waits for its conversion. *swapped: a swap completed (active() changed and is
  // ready), also when starting the next conversion then failed.
  absl::Status ApplyAtStepStart(StepTransfer& io, bool* swapped);

  const ModelParams& active() const;
  int64_t version() const { return version_; }

  // A LoRA adapter the weights run with (model/lora.h), or null, swapped like the weights:
  // StageAdapter (any thread) puts one aside with its version, replacing one staged before;
  // the next ApplyAtStepStart makes it adapter() (a pointer flip: the base weights stay, the
  // adapter's products run beside them) and its version version(), reporting a swap. A LoRA
  // learner's actors take each version as an adapter this way. SetAdapter (stepping thread)
  // replaces it at once and keeps the version. The caller checks the adapter fits.
  void StageAdapter(std::shared_ptr<const LoraSet> adapter, int64_t version);
  void SetAdapter(std::shared_ptr<const LoraSet> adapter) { adapter_ = std::move(adapter); }
  const LoraSet* adapter() const { return adapter_.get(); }
  // Double-buffered: the two copies, which the runner captures graphs for together. Else empty.
  std::vector<const ModelParams*> copies() const;
  int64_t swaps() const { return swaps_; }
  // Host time spent applying swaps: one copy, the conversion waited for; double-buffered,
  // launching the conversions and flipping.
  double swap_seconds() const { return swap_seconds_; }

 private:
  struct DeviceState;  // CUDA, double-buffered: the side stream and its events
  WeightSlots(std::shared_ptr<const ParameterSet> weights, int64_t version,
              const WeightSlotsOptions& options);
  absl::Status ApplyOneCopy(StepTransfer& io, bool* swapped);
  absl::Status ApplyDoubleBuffered(bool* swapped);
  // Counts a completed swap that began at `start`.
  void Flipped(std::chrono::steady_clock::time_point start, bool* swapped);

  const WeightSlotsOptions options_;
  const int64_t num_elements_;                   // every staged ParameterSet has this many
  std::shared_ptr<const ParameterSet> weights_;  // active()'s source
  int64_t version_;
  std::mutex mutex_;
  std::shared_ptr<const ParameterSet> pending_weights_;  // guarded by mutex_
  std::optional<int64_t> pending_version_;               // guarded by mutex_
  std::optional<ComputeParams> compute_;  // CUDA: the weights in options_.dtype (graphs use them)
  // Double-buffered: the second copy; `spare_active_` says which of the two runs. The weights
  // converting into the idle one (launched, not yet flipped to) and their version.
  std::optional<ComputeParams> spare_;
  bool spare_active_ = false;
  std::shared_ptr<const ParameterSet> converting_weights_;
  std::optional<int64_t> converting_version_;
  std::unique_ptr<DeviceState> device_state_;
  std::shared_ptr<const LoraSet> adapter_;
  std::shared_ptr<const LoraSet> pending_adapter_;      // guarded by mutex_
  std::optional<int64_t> pending_adapter_version_;      // guarded by mutex_
  int64_t swaps_ = 0;
  double swap_seconds_ = 0.0;
};

}  // namespace prl
