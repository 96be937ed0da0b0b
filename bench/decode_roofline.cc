#include "bench/decode_roofline.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "model/parameters.h"
#if PRL_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace prl::bench {

double MeanDecodeStepBytes(const ModelConfig& c, DType dtype, int64_t batch, int64_t prompt,
                           int64_t output) {
  const double elem = static_cast<double>(DTypeSize(dtype));
  const double table = static_cast<double>(c.vocab_size) * c.hidden_size;
  double weights = static_cast<double>(ParameterLayout(c).num_elements());
  if (!c.tie_word_embeddings) weights -= table;  // the embedding: `batch` rows only
  weights += static_cast<double>(batch) * c.hidden_size;
  const double kv_per_token =
      2.0 * c.num_hidden_layers * c.num_key_value_heads * c.head_dim;  // elements
  const double mean_context = static_cast<double>(prompt) + static_cast<double>(output) / 2.0;
  return (weights + batch * mean_context * kv_per_token) * elem;
}

absl::StatusOr<double> MeasureDeviceBandwidth(Device device, int64_t bytes) {
#if PRL_WITH_CUDA
  if (!device.is_cuda()) {
    return absl::UnimplementedError("device bandwidth: measured on CUDA devices only");
  }
  auto check = [](cudaError_t err, const char* what) -> absl::Status {
    if (err == cudaSuccess) return absl::OkStatus();
    return absl::InternalError(absl::StrCat("device bandwidth: ", what, ": ",
                                            cudaGetErrorString(err)));
  };
  absl::Status status = check(cudaSetDevice(device.index), "cudaSetDevice");
  if (!status.ok()) return status;
  void *src = nullptr, *dst = nullptr;
  status = check(cudaMalloc(&src, bytes), "cudaMalloc");
  if (status.ok()) status = check(cudaMalloc(&dst, bytes), "cudaMalloc");
  double best = 1e30;
  for (int i = 0; status.ok() && i < 6; ++i) {
    const auto start = std::chrono::steady_clock::now();
    status = check(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToDevice), "cudaMemcpy");
    if (status.ok()) status = check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (i > 0) best = std::min(best, s);  // the first copy is warm-up
  }
  cudaFree(src);
  cudaFree(dst);
  if (!status.ok()) return status;
  return 2.0 * static_cast<double>(bytes) / best;
#else
  (void)bytes;
  return absl::UnimplementedError(
      absl::StrCat("device bandwidth on ", device.ToString(), ": prl was built without CUDA"));
#endif
}

}  // namespace prl::bench
