#include "kernels/paged_attention.h"

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/dispatch.h"

namespace prl::kernels {

using internal::ExpectTensor;

namespace {
void CheckCache(const char* op, const Tensor& k_cache, const Tensor& v_cache,
                const AttentionShape& s) {
  PRL_CHECK(k_cache.rank == 4, op, ": k_cache must be (num_blocks, KV, D, block_size)");
  PRL_CHECK(s.head_dim <= 256, op, ": head_dim ", s.head_dim, " above the supported 256");
  ExpectTensor(op, "k_cache", k_cache, DType::kF32,
               {k_cache.size(0), s.num_kv_heads, s.head_dim, k_cache.size(3)});
  ExpectTensor(op, "v_cache", v_cache, DType::kF32,
               {k_cache.size(0), s.num_kv_heads, k_cache.size(3), s.head_dim});
}
}  // namespace

void KvCacheWrite(const Tensor& k_cache, const Tensor& v_cache, const Tensor& qkv,
                  const Tensor& slots, const AttentionShape& s) {
  const char* op = "KvCacheWrite";
  CheckCache(op, k_cache, v_cache, s);
  const int64_t T = qkv.size(0);
  ExpectTensor(op, "qkv", qkv, DType::kF32, {T, (s.num_heads + 2 * s.num_kv_heads) * s.head_dim});
  ExpectTensor(op, "slots", slots, DType::kI32, {T});
  const Device device = internal::CommonDevice(op, {&k_cache, &v_cache, &qkv, &slots});
  if (device.is_cpu()) {
    return cpu::KvCacheWrite(k_cache.f32(), v_cache.f32(), qkv.f32(), slots.i32(), T, s.num_heads,
                             s.num_kv_heads, s.head_dim, k_cache.size(3));
  }
  internal::NoBackend(op, device);
}

void KvCacheCopyBlocks(const Tensor& k_cache, const Tensor& v_cache, const Tensor& pairs) {
  const char* op = "KvCacheCopyBlocks";
  PRL_CHECK(k_cache.rank == 4 && v_cache.rank == 4 && k_cache.numel() == v_cache.numel(), op,
            ": caches must match");
  ExpectTensor(op, "pairs", pairs, DType::kI32, {pairs.size(0), 2});
  const Device device = internal::CommonDevice(op, {&k_cache, &v_cache, &pairs});
  if (device.is_cpu()) {
    return cpu::KvCacheCopyBlocks(k_cache.f32(), v_cache.f32(), pairs.i32(), pairs.size(0),
                                  v_cache.size(1), v_cache.size(3), v_cache.size(2));
  }
  internal::NoBackend(op, device);
}

void PagedAttentionForward(const Tensor& out, const Tensor& qkv, const Tensor& k_cache,
                           const Tensor& v_cache, const Tensor& block_tables, const Tensor& q_start,
                           const Tensor& context_lens, const AttentionShape& s,
                           ReductionOrder order) {
  const char* op = "PagedAttentionForward";
  CheckCache(op, k_cache, v_cache, s);
  const int64_t T = qkv.size(0), B = context_lens.size(0);
  ExpectTensor(op, "qkv", qkv, DType::kF32, {T, (s.num_heads + 2 * s.num_kv_heads) * s.head_dim});
  ExpectTensor(op, "out", out, DType::kF32, {T, s.num_heads * s.head_dim});
  ExpectTensor(op, "block_tables", block_tables, DType::kI32, {B, block_tables.size(1)});
  ExpectTensor(op, "q_start", q_start, DType::kI32, {B + 1});
  ExpectTensor(op, "context_lens", context_lens, DType::kI32, {B});
  const Device device = internal::CommonDevice(
      op, {&out, &qkv, &k_cache, &v_cache, &block_tables, &q_start, &context_lens});
  if (device.is_cpu()) {
    PRL_CHECK(q_start.i32()[0] == 0 && q_start.i32()[B] == T, op, ": q_start must span [0, ", T,
              ")");
    return cpu::PagedAttentionForward(
        out.f32(), qkv.f32(), k_cache.f32(), v_cache.f32(), block_tables.i32(),
        block_tables.size(1), q_start.i32(), context_lens.i32(), B, s.num_heads, s.num_kv_heads,
        s.head_dim, k_cache.size(3), order == ReductionOrder::kBatchInvariant);
  }
  internal::NoBackend(op, device);
}

}  // namespace prl::kernels
