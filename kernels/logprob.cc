#include "kernels/logprob.h"

#include <algorithm>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/dispatch.h"
#if PRL_WITH_CUDA
#include "kernels/cuda/cuda_ops.h"
#endif

namespace prl::kernels {

using internal::ExpectTensor;

int64_t LogprobChunkRows(int64_t vocab_size, int64_t budget_bytes) {
  return std::max<int64_t>(1, budget_bytes / (vocab_size * static_cast<int64_t>(sizeof(float))));
}

void LogprobForward(const Tensor& logprob, const Tensor& lse, const Tensor& h, const Tensor& W,
                    const Tensor& targets, float temperature, const Tensor& scratch,
                    ReductionOrder order, const Tensor* entropy) {
  const char* op = "LogprobForward";
  const int64_t R = h.size(0), C = h.size(1), V = W.size(0);
  PRL_CHECK(temperature > 0.0f, op, ": temperature ", temperature, " must be > 0");
  const DType dt = internal::ActivationDType(h);
  ExpectTensor(op, "h", h, dt, {R, C});
  ExpectTensor(op, "W", W, dt, {V, C});
  ExpectTensor(op, "logprob", logprob, DType::kF32, {R});
  ExpectTensor(op, "lse", lse, DType::kF32, {R});
  ExpectTensor(op, "targets", targets, DType::kI32, {R});
  ExpectTensor(op, "scratch", scratch, DType::kF32, {scratch.size(0), V});
  if (entropy != nullptr) ExpectTensor(op, "entropy", *entropy, DType::kF32, {R});
  const Device device = internal::CommonDevice(
      op, {&logprob, &lse, &h, &W, &targets, &scratch, entropy != nullptr ? entropy : &lse});
  float* entropy_out = entropy != nullptr ? entropy->f32() : nullptr;
  if (device.is_cpu()) {
    return cpu::LogprobForward(logprob.f32(), lse.f32(), h.f32(), W.f32(), targets.i32(), R, V, C,
                               temperature, scratch.f32(), scratch.size(0),
                               order == ReductionOrder::kBatchInvariant, entropy_out);
  }
#if PRL_WITH_CUDA
  return cuda::LogprobForward(device.index, dt, logprob.f32(), lse.f32(), h.data, W.data,
                              targets.i32(), R, V, C, temperature, scratch.f32(), scratch.size(0),
                              order == ReductionOrder::kBatchInvariant, entropy_out);
#else
  internal::NoBackend(op, device);
#endif
}

void LogprobBackward(const Tensor& dh, const Tensor& dW, const Tensor& dlogprob, const Tensor& h,
                     const Tensor& W, const Tensor& targets, const Tensor& lse, float temperature,
                     const Tensor& scratch, ReductionOrder order, bool logits_kept) {
  const char* op = "LogprobBackward";
  const int64_t R = h.size(0), C = h.size(1), V = W.size(0);
  PRL_CHECK(temperature > 0.0f, op, ": temperature ", temperature, " must be > 0");
  const DType dt = internal::ActivationDType(h);
  const DType dw_dt = dW.device.is_cuda() && dW.dtype == DType::kF32 ? DType::kF32 : dt;
  ExpectTensor(op, "dh", dh, dt, {R, C});
  if (dW.defined()) ExpectTensor(op, "dW", dW, dw_dt, {V, C});
  ExpectTensor(op, "dlogprob", dlogprob, DType::kF32, {R});
  ExpectTensor(op, "h", h, dt, {R, C});
  ExpectTensor(op, "W", W, dt, {V, C});
  ExpectTensor(op, "targets", targets, DType::kI32, {R});
  ExpectTensor(op, "lse", lse, DType::kF32, {R});
  ExpectTensor(op, "scratch", scratch, DType::kF32, {scratch.size(0), V});
  PRL_CHECK(!logits_kept || scratch.size(0) >= R, op, ": logits kept in a scratch of ",
            scratch.size(0), " rows for ", R);
  const Device device =
      internal::CommonDevice(op, {&dh, &dW, &dlogprob, &h, &W, &targets, &lse, &scratch});
  if (device.is_cpu()) {
    return cpu::LogprobBackward(dh.f32(), dW.defined() ? dW.f32() : nullptr, dlogprob.f32(),
                                h.f32(), W.f32(), targets.i32(), lse.f32(), R, V, C, temperature,
                                scratch.f32(), scratch.size(0),
                                order == ReductionOrder::kBatchInvariant, logits_kept);
  }
#if PRL_WITH_CUDA
  // The backward on CUDA is deterministic but has one order (gradients need no bit-equality
  // with the engine).
  (void)order;
  const int64_t chunk = scratch.size(0);
  // F32 mode turns the logits into dlogits in place; BF16 mode writes them as BF16 for the
  // tensor-core GEMMs.
  void* dlogits = dt == DType::kF32
                      ? static_cast<void*>(scratch.f32())
                      : cuda::ScratchAlloc(device.index, static_cast<size_t>(chunk * V) * 2);
  cuda::LogprobBackward(device.index, dt, dh.data, dW.defined() ? dW.data : nullptr, dw_dt,
                        dlogprob.f32(), h.data, W.data, targets.i32(), lse.f32(), R, V, C,
                        temperature, scratch.f32(), dlogits, chunk, logits_kept);
  if (dt != DType::kF32) cuda::ScratchFree(device.index, dlogits);
  return;
#else
  internal::NoBackend(op, device);
#endif
}

}  // namespace prl::kernels
