// FLOP accounting for benchmarks: the work a pass must do, counted the way MFU figures are
// (2 FLOPs per multiply-add of every GEMM, causal attention counted over the visible keys
// only); recomputation done by an implementation is not counted. A Qwen3-MoE layer counts its
// router and the K experts a token is routed to: its active parameters, not all E experts.
#pragma once

#include <cstdint>
#include <vector>

#include "model/config.h"

namespace prl {

// Forward FLOPs over sequences of the given lengths, with the LM head on `head_rows` rows.
double ForwardFlops(const ModelConfig& config, const std::vector<int64_t>& seq_lens,
                    int64_t head_rows);
// Forward + backward = 3x forward (the backward has two GEMMs per forward GEMM).
inline double TrainingFlops(const ModelConfig& config, const std::vector<int64_t>& seq_lens,
                            int64_t head_rows) {
  return 3.0 * ForwardFlops(config, seq_lens, head_rows);
}

}  // namespace prl
