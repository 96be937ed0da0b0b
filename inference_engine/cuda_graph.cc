#include "inference_engine/cuda_graph.h"

#include <utility>

#include "absl/strings/str_cat.h"
#if PRL_WITH_CUDA
#include <cuda_runtime.h>

#include "core/cuda/cuda_check.h"
#include "core/cuda/stream.h"
#endif

namespace prl {

CudaGraph::CudaGraph(CudaGraph&& other) noexcept
    : device_(other.device_), exec_(std::exchange(other.exec_, nullptr)) {}

CudaGraph& CudaGraph::operator=(CudaGraph&& other) noexcept {
  if (this != &other) {
    this->~CudaGraph();
    device_ = other.device_;
    exec_ = std::exchange(other.exec_, nullptr);
  }
  return *this;
}

CudaGraph::~CudaGraph() {
#if PRL_WITH_CUDA
  if (exec_ != nullptr) cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(exec_));
#endif
  exec_ = nullptr;
}

absl::StatusOr<CudaGraph> CudaGraph::Capture(Device device, const std::function<void()>& body) {
#if PRL_WITH_CUDA
  if (!device.is_cuda()) {
    return absl::InvalidArgumentError(absl::StrCat("CUDA graph: device ", device.ToString()));
  }
  const cudaStream_t stream = cuda::CurrentStream(device.index);
  if (stream == cudaStreamLegacy || stream == nullptr) {
    return absl::FailedPreconditionError(
        "CUDA graph: capture needs a non-default stream (cuda::StreamGuard)");
  }
  absl::Status status =
      PRL_CUDA_STATUS(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  if (!status.ok()) return status;
  body();
  cudaGraph_t graph = nullptr;
  status = PRL_CUDA_STATUS(cudaStreamEndCapture(stream, &graph));
  if (!status.ok()) return status;
  cudaGraphExec_t exec = nullptr;
  status = PRL_CUDA_STATUS(cudaGraphInstantiate(&exec, graph, 0));
  cudaGraphDestroy(graph);
  if (!status.ok()) return status;
  CudaGraph out;
  out.device_ = device;
  out.exec_ = exec;
  return out;
#else
  (void)body;
  return absl::UnimplementedError(
      absl::StrCat("CUDA graph on ", device.ToString(), ": prl was built without CUDA"));
#endif
}

absl::Status CudaGraph::Launch() const {
#if PRL_WITH_CUDA
  if (exec_ == nullptr)
    return absl::FailedPreconditionError("CUDA graph: launch of an empty graph");
  return PRL_CUDA_STATUS(
      cudaGraphLaunch(static_cast<cudaGraphExec_t>(exec_), cuda::CurrentStream(device_.index)));
#else
  return absl::UnimplementedError("CUDA graph: prl was built without CUDA");
#endif
}

}  // namespace prl
