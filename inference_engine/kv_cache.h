// KvCache: the paged key/value pool, allocated once from a memory budget. Layer l's keys are
// k[l] and its values v[l] in the layout of their device (kernels/paged_attention.h): on the
// CPU F32 keys (num_blocks, KV, D, block_size) and values (num_blocks, KV, block_size, D); on
// CUDA both (num_blocks, KV, block_size, D) in the engine's compute dtype (BF16 or F32). One
// Buffer holds all layers.
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
  DType dtype = DType::kF32;
  Buffer buffer;
  std::vector<Tensor> k, v;  // per layer

  // Bytes one block takes over all layers (K and V).
  static int64_t BytesPerBlock(const ModelConfig& config, int64_t block_size,
                               DType dtype = DType::kF32);
  // As many blocks as fit in budget_bytes; an error if not even one does, or if the dtype is
  // not the device's (F32 on the CPU; F32 or BF16 on CUDA).
  static absl::StatusOr<KvCache> Allocate(const ModelConfig& config, int64_t budget_bytes,
                                          int64_t block_size, Device device,
                                          DType dtype = DType::kF32);
};

}  // namespace prl
