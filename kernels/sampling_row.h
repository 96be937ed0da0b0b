// One row's sampling parameters (kernels/sampling.h), as plain data shared by the CPU and CUDA
// backends: the CUDA sampler reads an array of these from device memory, so a step's rows are
// uploaded with the rest of the step's metadata (and stay valid under a CUDA graph).
#pragma once

#include <cstdint>

namespace prl::kernels {

struct SamplingRow {
  float temperature = 1.0f;  // >= 0
  float top_p = 1.0f;        // (0, 1]
  int32_t top_k = 0;         // 0 = no limit
  int32_t reserved = 0;      // padding, zero
  uint64_t seed = 0;         // the request's seed
  uint64_t stream = 0;       // which sample of the request
  uint64_t index = 0;        // which token of that sample
};

// A row as I32 words: rows tensors are (R, kSamplingRowWords) I32.
inline constexpr int64_t kSamplingRowWords = 10;
static_assert(sizeof(SamplingRow) == 4 * kSamplingRowWords, "SamplingRow must stay 40 bytes");

}  // namespace prl::kernels
