#include "kernels/paged_attention.h"

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/dispatch.h"
#include "kernels/rope.h"
#if PRL_WITH_CUDA
#include "kernels/cuda/cuda_ops.h"
#endif

namespace prl::kernels {

using internal::ExpectTensor;

int64_t KvCacheBlockSize(const Tensor& k_cache) {
  PRL_CHECK(k_cache.rank == 4, "k_cache must have rank 4, found ", k_cache.rank);
  return k_cache.device.is_cpu() ? k_cache.size(3) : k_cache.size(2);
}

namespace {
void CheckCache(const char* op, const Tensor& k_cache, const Tensor& v_cache,
                const AttentionShape& s) {
  PRL_CHECK(k_cache.rank == 4, op, ": k_cache must be (num_blocks, KV, D, block_size) on the CPU, ",
            "(num_blocks, KV, block_size, D) on CUDA");
  PRL_CHECK(s.num_heads > 0 && s.num_kv_heads > 0 && s.num_heads % s.num_kv_heads == 0, op, ": ",
            s.num_heads, " query heads are not a multiple of ", s.num_kv_heads, " kv heads");
  PRL_CHECK(s.head_dim <= 256, op, ": head_dim ", s.head_dim, " above the supported 256");
  const DType dt = internal::ActivationDType(k_cache);
  const int64_t nb = k_cache.size(0), bs = KvCacheBlockSize(k_cache);
  if (k_cache.device.is_cpu()) {
    ExpectTensor(op, "k_cache", k_cache, dt, {nb, s.num_kv_heads, s.head_dim, bs});
  } else {
    ExpectTensor(op, "k_cache", k_cache, dt, {nb, s.num_kv_heads, bs, s.head_dim});
  }
  ExpectTensor(op, "v_cache", v_cache, dt, {nb, s.num_kv_heads, bs, s.head_dim});
}
}  // namespace

void KvCacheWrite(const Tensor& k_cache, const Tensor& v_cache, const Tensor& qkv,
                  const Tensor& slots, const AttentionShape& s) {
  const char* op = "KvCacheWrite";
  CheckCache(op, k_cache, v_cache, s);
  const int64_t T = qkv.size(0);
  ExpectTensor(op, "qkv", qkv, k_cache.dtype, {T, (s.num_heads + 2 * s.num_kv_heads) * s.head_dim});
  ExpectTensor(op, "slots", slots, DType::kI32, {T});
  const Device device = internal::CommonDevice(op, {&k_cache, &v_cache, &qkv, &slots});
  const int64_t bs = KvCacheBlockSize(k_cache);
  if (device.is_cpu()) {
    return cpu::KvCacheWrite(k_cache.f32(), v_cache.f32(), qkv.f32(), slots.i32(), T, s.num_heads,
                             s.num_kv_heads, s.head_dim, bs);
  }
#if PRL_WITH_CUDA
  return cuda::KvCacheWrite(device.index, k_cache.dtype, k_cache.data, v_cache.data, qkv.data,
                            slots.i32(), T, s.num_heads, s.num_kv_heads, s.head_dim, bs);
#else
  internal::NoBackend(op, device);
#endif
}

void RopeKvCacheWrite(const Tensor& k_cache, const Tensor& v_cache, const Tensor& qkv,
                      const Tensor& slots, const Tensor& cos, const Tensor& sin,
                      const AttentionShape& s) {
  const char* op = "RopeKvCacheWrite";
  const Device device = internal::CommonDevice(op, {&k_cache, &v_cache, &qkv, &slots, &cos, &sin});
  if (device.is_cpu()) {
    RopeApply(qkv, s.num_heads + s.num_kv_heads, s.head_dim, cos, sin, /*inverse=*/false);
    return KvCacheWrite(k_cache, v_cache, qkv, slots, s);
  }
#if PRL_WITH_CUDA
  CheckCache(op, k_cache, v_cache, s);
  const int64_t T = qkv.size(0);
  ExpectTensor(op, "qkv", qkv, k_cache.dtype, {T, (s.num_heads + 2 * s.num_kv_heads) * s.head_dim});
  ExpectTensor(op, "slots", slots, DType::kI32, {T});
  ExpectTensor(op, "cos", cos, DType::kF32, {T, s.head_dim / 2});
  ExpectTensor(op, "sin", sin, DType::kF32, {T, s.head_dim / 2});
  PRL_CHECK(s.head_dim % 2 == 0, op, ": head_dim ", s.head_dim, " is odd");
  return cuda::RopeKvCacheWrite(device.index, k_cache.dtype, k_cache.data, v_cache.data, qkv.data,
                                slots.i32(), cos.f32(), sin.f32(), T, s.num_heads, s.num_kv_heads,
                                s.head_dim, KvCacheBlockSize(k_cache));
#else
  internal::NoBackend(op, device);
#endif
}

void KvCacheCopyBlocks(const Tensor& k_cache, const Tensor& v_cache, const Tensor& pairs) {
  const char* op = "KvCacheCopyBlocks";
  PRL_CHECK(k_cache.rank == 4 && v_cache.rank == 4 && k_cache.numel() == v_cache.numel() &&
                k_cache.dtype == v_cache.dtype,
            op, ": caches must match");
  ExpectTensor(op, "pairs", pairs, DType::kI32, {pairs.size(0), 2});
  const Device device = internal::CommonDevice(op, {&k_cache, &v_cache, &pairs});
  if (device.is_cpu()) {
    return cpu::KvCacheCopyBlocks(k_cache.f32(), v_cache.f32(), pairs.i32(), pairs.size(0),
                                  v_cache.size(1), v_cache.size(3), v_cache.size(2));
  }
#if PRL_WITH_CUDA
  const int64_t block_bytes =
      k_cache.numel() / k_cache.size(0) * static_cast<int64_t>(DTypeSize(k_cache.dtype));
  return cuda::KvCacheCopyBlocks(device.index, k_cache.data, v_cache.data, pairs.i32(),
                                 pairs.size(0), block_bytes);
#else
  internal::NoBackend(op, device);
#endif
}

void PagedAttentionForward(const Tensor& out, const Tensor& qkv, const Tensor& k_cache,
                           const Tensor& v_cache, const Tensor& block_tables, const Tensor& q_start,
                           const Tensor& context_lens, const AttentionShape& s,
                           ReductionOrder order, bool single_token_rows) {
  const char* op = "PagedAttentionForward";
  CheckCache(op, k_cache, v_cache, s);
  const int64_t T = qkv.size(0), B = context_lens.size(0);
  const DType dt = k_cache.dtype;
  ExpectTensor(op, "qkv", qkv, dt, {T, (s.num_heads + 2 * s.num_kv_heads) * s.head_dim});
  ExpectTensor(op, "out", out, dt, {T, s.num_heads * s.head_dim});
  ExpectTensor(op, "block_tables", block_tables, DType::kI32, {B, block_tables.size(1)});
  ExpectTensor(op, "q_start", q_start, DType::kI32, {B + 1});
  ExpectTensor(op, "context_lens", context_lens, DType::kI32, {B});
  const Device device = internal::CommonDevice(
      op, {&out, &qkv, &k_cache, &v_cache, &block_tables, &q_start, &context_lens});
  const int64_t bs = KvCacheBlockSize(k_cache);
  const bool invariant = order == ReductionOrder::kBatchInvariant;
  PRL_CHECK(!single_token_rows || T == B, op, ": single_token_rows with ", T, " rows for ", B,
            " sequences");
  if (device.is_cpu()) {
    PRL_CHECK(q_start.i32()[0] == 0 && q_start.i32()[B] == T, op, ": q_start must span [0, ", T,
              ")");
    return cpu::PagedAttentionForward(out.f32(), qkv.f32(), k_cache.f32(), v_cache.f32(),
                                      block_tables.i32(), block_tables.size(1), q_start.i32(),
                                      context_lens.i32(), B, s.num_heads, s.num_kv_heads,
                                      s.head_dim, bs, invariant);
  }
#if PRL_WITH_CUDA
  // The metadata lives on the device: its consistency is the engine's (ModelRunner) to keep.
  return cuda::PagedAttentionForward(device.index, dt, out.data, qkv.data, k_cache.data,
                                     v_cache.data, block_tables.i32(), block_tables.size(1),
                                     q_start.i32(), context_lens.i32(), B, T, s.num_heads,
                                     s.num_kv_heads, s.head_dim, bs, invariant, single_token_rows);
#else
  internal::NoBackend(op, device);
#endif
}

}  // namespace prl::kernels
