#include "inference_engine/kv_cache.h"

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"

namespace prl {

int64_t KvCache::BytesPerBlock(const ModelConfig& c, int64_t block_size) {
  return 2 * c.num_hidden_layers * c.num_key_value_heads * block_size * c.head_dim *
         static_cast<int64_t>(sizeof(float));
}

absl::StatusOr<KvCache> KvCache::Allocate(const ModelConfig& c, int64_t budget_bytes,
                                          int64_t block_size, Device device) {
  const int64_t per_block = BytesPerBlock(c, block_size);
  KvCache cache;
  cache.block_size = block_size;
  cache.num_blocks = budget_bytes / per_block;
  if (cache.num_blocks < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "kv cache: a budget of ", budget_bytes, " bytes holds no block of ", block_size,
        " tokens (", per_block, " bytes for this model); raise --kv-cache-mb"));
  }
  if (cache.num_blocks > (int64_t{1} << 30)) cache.num_blocks = int64_t{1} << 30;
  // Zeroed: the pool is touched once here rather than page-faulted in during generation.
  PRL_ASSIGN_OR_RETURN(cache.buffer, Buffer::AllocateZeroed(device, cache.num_blocks * per_block));
  const int64_t layer_floats = cache.num_blocks * c.num_key_value_heads * block_size * c.head_dim;
  float* base = static_cast<float*>(cache.buffer.data());
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    cache.k.push_back(Tensor(base + (2 * l) * layer_floats, DType::kF32, device,
                             {cache.num_blocks, c.num_key_value_heads, c.head_dim, block_size}));
    cache.v.push_back(Tensor(base + (2 * l + 1) * layer_floats, DType::kF32, device,
                             {cache.num_blocks, c.num_key_value_heads, block_size, c.head_dim}));
  }
  return cache;
}

}  // namespace prl
