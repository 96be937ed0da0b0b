#include "inference_engine/kv_cache.h"

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"

namespace prl {

int64_t KvCache::BytesPerBlock(const ModelConfig& c, int64_t block_size, DType dtype) {
  return 2 * c.num_hidden_layers * c.num_key_value_heads * block_size * c.head_dim *
         static_cast<int64_t>(DTypeSize(dtype));
}

absl::StatusOr<KvCache> KvCache::Allocate(const ModelConfig& c, int64_t budget_bytes,
                                          int64_t block_size, Device device, DType dtype) {
  const bool supported = dtype == DType::kF32 || (device.is_cuda() && dtype == DType::kBF16);
  if (!supported) {
    return absl::InvalidArgumentError(absl::StrCat("kv cache: dtype ", DTypeName(dtype), " on ",
                                                   device.ToString(),
                                                   " (expected f32, or bf16 on CUDA)"));
  }
  const int64_t per_block = BytesPerBlock(c, block_size, dtype);
  KvCache cache;
  cache.block_size = block_size;
  cache.dtype = dtype;
  cache.num_blocks = budget_bytes / per_block;
  if (cache.num_blocks < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "kv cache: a budget of ", budget_bytes, " bytes holds no block of ", block_size,
        " tokens (", per_block, " bytes for this model); raise --kv-cache-mb"));
  }
  if (cache.num_blocks > (int64_t{1} << 30)) cache.num_blocks = int64_t{1} << 30;
  // Zeroed: the pool is touched once here rather than page-faulted in during generation, and
  // a key never written is finite.
  PRL_ASSIGN_OR_RETURN(cache.buffer, Buffer::AllocateZeroed(device, cache.num_blocks * per_block));
  const int64_t KV = c.num_key_value_heads, D = c.head_dim, nb = cache.num_blocks;
  const int64_t layer_bytes = nb * KV * block_size * D * static_cast<int64_t>(DTypeSize(dtype));
  char* base = static_cast<char*>(cache.buffer.data());
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    if (device.is_cpu()) {
      cache.k.push_back(
          Tensor(base + (2 * l) * layer_bytes, dtype, device, {nb, KV, D, block_size}));
    } else {
      cache.k.push_back(
          Tensor(base + (2 * l) * layer_bytes, dtype, device, {nb, KV, block_size, D}));
    }
    cache.v.push_back(
        Tensor(base + (2 * l + 1) * layer_bytes, dtype, device, {nb, KV, block_size, D}));
  }
  return cache;
}

}  // namespace prl
