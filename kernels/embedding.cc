#include "kernels/embedding.h"

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/dispatch.h"

namespace prl::kernels {

using internal::ExpectTensor;

void EmbeddingForward(const Tensor& out, const Tensor& table, const Tensor& tokens) {
  const char* op = "EmbeddingForward";
  const int64_t T = tokens.size(0), C = table.size(1);
  ExpectTensor(op, "tokens", tokens, DType::kI32, {T});
  ExpectTensor(op, "table", table, DType::kF32, {table.size(0), C});
  ExpectTensor(op, "out", out, DType::kF32, {T, C});
  const Device device = internal::CommonDevice(op, {&out, &table, &tokens});
  if (device.is_cpu()) return cpu::EmbeddingForward(out.f32(), table.f32(), tokens.i32(), T, C);
  internal::NoBackend(op, device);
}

void EmbeddingBackward(const Tensor& dtable, const Tensor& dout, const Tensor& tokens) {
  const char* op = "EmbeddingBackward";
  const int64_t T = tokens.size(0), C = dtable.size(1);
  ExpectTensor(op, "tokens", tokens, DType::kI32, {T});
  ExpectTensor(op, "dtable", dtable, DType::kF32, {dtable.size(0), C});
  ExpectTensor(op, "dout", dout, DType::kF32, {T, C});
  const Device device = internal::CommonDevice(op, {&dtable, &dout, &tokens});
  if (device.is_cpu()) return cpu::EmbeddingBackward(dtable.f32(), dout.f32(), tokens.i32(), T, C);
  internal::NoBackend(op, device);
}

}  // namespace prl::kernels
