#include "kernels/logprob.h"

#include <algorithm>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/dispatch.h"

namespace prl::kernels {

using internal::ExpectTensor;

int64_t LogprobChunkRows(int64_t vocab_size, int64_t budget_bytes) {
  return std::max<int64_t>(1, budget_bytes / (vocab_size * static_cast<int64_t>(sizeof(float))));
}

void LogprobForward(const Tensor& logprob, const Tensor& lse, const Tensor& h, const Tensor& W,
                    const Tensor& targets, float temperature, const Tensor& scratch,
                    ReductionOrder order) {
  const char* op = "LogprobForward";
  const int64_t R = h.size(0), C = h.size(1), V = W.size(0);
  PRL_CHECK(temperature > 0.0f, op, ": temperature ", temperature, " must be > 0");
  ExpectTensor(op, "h", h, DType::kF32, {R, C});
  ExpectTensor(op, "W", W, DType::kF32, {V, C});
  ExpectTensor(op, "logprob", logprob, DType::kF32, {R});
  ExpectTensor(op, "lse", lse, DType::kF32, {R});
  ExpectTensor(op, "targets", targets, DType::kI32, {R});
  ExpectTensor(op, "scratch", scratch, DType::kF32, {scratch.size(0), V});
  const Device device = internal::CommonDevice(op, {&logprob, &lse, &h, &W, &targets, &scratch});
  if (device.is_cpu()) {
    return cpu::LogprobForward(logprob.f32(), lse.f32(), h.f32(), W.f32(), targets.i32(), R, V, C,
                               temperature, scratch.f32(), scratch.size(0),
                               order == ReductionOrder::kBatchInvariant);
  }
  internal::NoBackend(op, device);
}

void LogprobBackward(const Tensor& dh, const Tensor& dW, const Tensor& dlogprob, const Tensor& h,
                     const Tensor& W, const Tensor& targets, const Tensor& lse, float temperature,
                     const Tensor& scratch, ReductionOrder order) {
  const char* op = "LogprobBackward";
  const int64_t R = h.size(0), C = h.size(1), V = W.size(0);
  PRL_CHECK(temperature > 0.0f, op, ": temperature ", temperature, " must be > 0");
  ExpectTensor(op, "dh", dh, DType::kF32, {R, C});
  ExpectTensor(op, "dW", dW, DType::kF32, {V, C});
  ExpectTensor(op, "dlogprob", dlogprob, DType::kF32, {R});
  ExpectTensor(op, "h", h, DType::kF32, {R, C});
  ExpectTensor(op, "W", W, DType::kF32, {V, C});
  ExpectTensor(op, "targets", targets, DType::kI32, {R});
  ExpectTensor(op, "lse", lse, DType::kF32, {R});
  ExpectTensor(op, "scratch", scratch, DType::kF32, {scratch.size(0), V});
  const Device device =
      internal::CommonDevice(op, {&dh, &dW, &dlogprob, &h, &W, &targets, &lse, &scratch});
  if (device.is_cpu()) {
    return cpu::LogprobBackward(dh.f32(), dW.f32(), dlogprob.f32(), h.f32(), W.f32(), targets.i32(),
                                lse.f32(), R, V, C, temperature, scratch.f32(), scratch.size(0),
                                order == ReductionOrder::kBatchInvariant);
  }
  internal::NoBackend(op, device);
}

}  // namespace prl::kernels
