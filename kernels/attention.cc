#include "kernels/attention.h"

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/dispatch.h"
#if PRL_WITH_CUDA
#include "kernels/cuda/attention_kernels.h"
#include "kernels/cuda/cuda_ops.h"
#endif

namespace prl::kernels {

using internal::ExpectTensor;

namespace {
void CheckShape(const char* op, const AttentionShape& s, const Tensor& qkv,
                const Tensor& cu_seqlens) {
  PRL_CHECK(s.num_heads > 0 && s.num_kv_heads > 0 && s.num_heads % s.num_kv_heads == 0, op, ": ",
            s.num_heads, " query heads are not a multiple of ", s.num_kv_heads, " kv heads");
  PRL_CHECK(s.head_dim <= 256, op, ": head_dim ", s.head_dim, " above the supported 256");
  ExpectTensor(op, "qkv", qkv, internal::ActivationDType(qkv),
               {qkv.size(0), (s.num_heads + 2 * s.num_kv_heads) * s.head_dim});
  PRL_CHECK(cu_seqlens.dtype == DType::kI32 && cu_seqlens.rank == 1 && cu_seqlens.size(0) >= 2, op,
            ": cu_seqlens must be a non-empty I32 vector of B + 1 offsets");
}
}  // namespace

void AttentionForward(const Tensor& out, const Tensor& lse, const Tensor& qkv,
                      const Tensor& cu_seqlens, const AttentionShape& shape, ReductionOrder order) {
  const char* op = "AttentionForward";
  CheckShape(op, shape, qkv, cu_seqlens);
  const int64_t T = qkv.size(0), H = shape.num_heads, D = shape.head_dim;
  const DType dt = internal::ActivationDType(qkv);
  ExpectTensor(op, "out", out, dt, {T, H * D});
  ExpectTensor(op, "lse", lse, DType::kF32, {T, H});
  const Device device = internal::CommonDevice(op, {&out, &lse, &qkv, &cu_seqlens});
  if (device.is_cpu()) {
    const int32_t* cu = cu_seqlens.i32();
    const int64_t B = cu_seqlens.size(0) - 1;
    PRL_CHECK(cu[0] == 0 && cu[B] == T, op, ": cu_seqlens must span [0, ", T, ")");
    if (order == ReductionOrder::kBatchInvariant) {
      return cpu::AttentionForwardInvariant(out.f32(), lse.f32(), qkv.f32(), cu, B, H,
                                            shape.num_kv_heads, D);
    }
    return cpu::AttentionForward(out.f32(), lse.f32(), qkv.f32(), cu, B, H, shape.num_kv_heads, D);
  }
#if PRL_WITH_CUDA
  // cu_seqlens lives on the device: its span is validated where it is built (PackedBatch).
  // Every row's result depends only on its own sequence in both orders; the batch-invariant
  // order is the engine's paged-attention row order, so the two agree bit for bit.
  if (order == ReductionOrder::kBatchInvariant) {
    return cuda::AttentionForwardInvariant(device.index, dt, out.data, lse.f32(), qkv.data,
                                           cu_seqlens.i32(), cu_seqlens.size(0) - 1, T, H,
                                           shape.num_kv_heads, D);
  }
  if (cuda::FlashAttentionSupported(dt, D, {out.data, qkv.data})) {
    return cuda::FlashAttentionForward(device.index, out.data, lse.f32(), qkv.data,
                                       cu_seqlens.i32(), cu_seqlens.size(0) - 1, T, H,
                                       shape.num_kv_heads, D);
  }
  return cuda::AttentionForward(device.index, dt, out.data, lse.f32(), qkv.data, cu_seqlens.i32(),
                                cu_seqlens.size(0) - 1, T, H, shape.num_kv_heads, D);
#else
  internal::NoBackend(op, device);
#endif
}

void AttentionBackward(const Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out,
                       const Tensor& lse, const Tensor& cu_seqlens, const AttentionShape& shape) {
  const char* op = "AttentionBackward";
  CheckShape(op, shape, qkv, cu_seqlens);
  const int64_t T = qkv.size(0), H = shape.num_heads, D = shape.head_dim;
  const DType dt = internal::ActivationDType(qkv);
  ExpectTensor(op, "dqkv", dqkv, dt, {T, qkv.size(1)});
  ExpectTensor(op, "dout", dout, dt, {T, H * D});
  ExpectTensor(op, "out", out, dt, {T, H * D});
  ExpectTensor(op, "lse", lse, DType::kF32, {T, H});
  const Device device = internal::CommonDevice(op, {&dqkv, &dout, &qkv, &out, &lse, &cu_seqlens});
  if (device.is_cpu()) {
    const int32_t* cu = cu_seqlens.i32();
    const int64_t B = cu_seqlens.size(0) - 1;
    PRL_CHECK(cu[0] == 0 && cu[B] == T, op, ": cu_seqlens must span [0, ", T, ")");
    return cpu::AttentionBackward(dqkv.f32(), dout.f32(), qkv.f32(), out.f32(), lse.f32(), cu, B, H,
                                  shape.num_kv_heads, D);
  }
#if PRL_WITH_CUDA
  float* delta = static_cast<float*>(
      cuda::ScratchAlloc(device.index, static_cast<size_t>(T * H) * sizeof(float)));
  if (cuda::FlashAttentionSupported(dt, D, {dqkv.data, dout.data, qkv.data, out.data})) {
    cuda::FlashAttentionBackward(device.index, dqkv.data, dout.data, qkv.data, out.data, lse.f32(),
                                 cu_seqlens.i32(), cu_seqlens.size(0) - 1, T, H, shape.num_kv_heads,
                                 D, delta);
  } else {
    cuda::AttentionBackward(device.index, dt, dqkv.data, dout.data, qkv.data, out.data, lse.f32(),
                            cu_seqlens.i32(), cu_seqlens.size(0) - 1, T, H, shape.num_kv_heads, D,
                            delta);
  }
  return cuda::ScratchFree(device.index, delta);
#else
  internal::NoBackend(op, device);
#endif
}

}  // namespace prl::kernels
