// `prl bench model`: training-path throughput of the transformer (forward, and forward +
// backward) on random weights and tokens, beside OpenBLAS SGEMM measured in the same run on
// the shape of the model's MLP projection (T x C times C x 2I).
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"
#include "bench/report.h"
#include "core/device.h"
#include "core/dtype.h"
#include "model/config.h"

namespace prl::bench {

struct ModelBenchOptions {
  int64_t tokens = 2048;  // per step, packed
  int64_t seq_len = 512;  // sequences of this length (the last one may be shorter)
  int iterations = 5;     // timed repetitions of each measurement; the median is reported
  Device device = Device::Cpu();
  DType dtype = DType::kF32;  // BF16: the CUDA bf16 mode (compute weights and activations)
  bool progress = true;       // progress lines on stderr
};

absl::StatusOr<Report> RunModelBench(const ModelConfig& config, const ModelBenchOptions& options);

}  // namespace prl::bench
