// CudaGraph: one captured sequence of kernels on the calling thread's current stream, replayed
// with a single launch (the engine's decode step per batch bucket: ~10 kernels per layer that
// would otherwise be launch-bound at small batch).
//
// Capture records the kernels that `body` queues on the current stream (which must not be the
// legacy default stream: the engine runs its steps on its own stream); every pointer they use
// is baked in, so the captured buffers (activations, metadata, weights, KV cache) must stay
// where they are for the graph's lifetime — new inputs are copied into them before Launch.
// Without CUDA, Capture reports that CUDA is absent. Move-only; not thread-safe.
#pragma once

#include <functional>

#include "absl/status/statusor.h"
#include "core/device.h"

namespace prl {

class CudaGraph {
 public:
  CudaGraph() = default;
  CudaGraph(CudaGraph&& other) noexcept;
  CudaGraph& operator=(CudaGraph&& other) noexcept;
  CudaGraph(const CudaGraph&) = delete;
  CudaGraph& operator=(const CudaGraph&) = delete;
  ~CudaGraph();

  static absl::StatusOr<CudaGraph> Capture(Device device, const std::function<void()>& body);
  // Queues the graph on the current stream.
  absl::Status Launch() const;
  bool valid() const { return exec_ != nullptr; }

 private:
  Device device_;
  void* exec_ = nullptr;  // cudaGraphExec_t
};

}  // namespace prl
