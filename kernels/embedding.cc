#include "kernels/embedding.h"

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/dispatch.h"
#if PRL_WITH_CUDA
#include "kernels/cuda/cuda_ops.h"
#endif

namespace prl::kernels {

using internal::ExpectTensor;

void EmbeddingForward(const Tensor& out, const Tensor& table, const Tensor& tokens) {
  const char* op = "EmbeddingForward";
  const int64_t T = tokens.size(0), C = table.size(1);
  ExpectTensor(op, "tokens", tokens, DType::kI32, {T});
  const DType dt = internal::ActivationDType(table);
  ExpectTensor(op, "table", table, dt, {table.size(0), C});
  ExpectTensor(op, "out", out, dt, {T, C});
  const Device device = internal::CommonDevice(op, {&out, &table, &tokens});
  if (device.is_cpu()) return cpu::EmbeddingForward(out.f32(), table.f32(), tokens.i32(), T, C);
#if PRL_WITH_CUDA
  return cuda::EmbeddingForward(device.index, dt, out.data, table.data, tokens.i32(), T, C);
#else
  internal::NoBackend(op, device);
#endif
}

void EmbeddingBackward(const Tensor& dtable, const Tensor& dout, const Tensor& tokens) {
  const char* op = "EmbeddingBackward";
  const int64_t T = tokens.size(0), C = dtable.size(1);
  ExpectTensor(op, "tokens", tokens, DType::kI32, {T});
  // dtable is F32 (weight gradients); on CUDA it may also be BF16 (the bf16 mode's row
  // scatter-add of activation gradients).
  const DType dtable_dt =
      dtable.device.is_cuda() && dtable.dtype == DType::kBF16 ? DType::kBF16 : DType::kF32;
  ExpectTensor(op, "dtable", dtable, dtable_dt, {dtable.size(0), C});
  ExpectTensor(op, "dout", dout, internal::ActivationDType(dout), {T, C});
  const Device device = internal::CommonDevice(op, {&dtable, &dout, &tokens});
  if (device.is_cpu()) return cpu::EmbeddingBackward(dtable.f32(), dout.f32(), tokens.i32(), T, C);
#if PRL_WITH_CUDA
  return cuda::EmbeddingBackward(device.index, dout.dtype, dtable_dt, dtable.data, dout.data,
                                 tokens.i32(), T, C);
#else
  internal::NoBackend(op, device);
#endif
}

}  // namespace prl::kernels
