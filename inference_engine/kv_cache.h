// KvCache: the paged key/value pool, allocated once from a memory budget. Layer l's keys are
// k[l] (num_blocks, KV, D, block_size), its values v[l] (num_blocks, KV, block_size, D)
// (kernels/paged_attention.h); one Buffer holds all layers.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "core/buffer.h"
#include "core/tensor.h"
#include "model/config.h"

namespace prl {

struct KvCache {
  int64_t num_blocks = 0;
  int64_t block_size = 0;
  Buffer buffer;
  std::vector<Tensor> k, v;  // per layer

  // Bytes one block takes over all layers (K and V).
  static int64_t BytesPerBlock(const ModelConfig& config, int64_t block_size);
  // As many blocks as fit in budget_bytes; an error if not even one does.
  static absl::StatusOr<KvCache> Allocate(const ModelConfig& config, int64_t budget_bytes,
                                          int64_t block_size, Device device);
};

}  // namespace prl
