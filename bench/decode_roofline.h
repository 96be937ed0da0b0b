// The HBM roofline of decoding (`prl bench engine --device cuda`): a decode step must read every
// weight once and every cached key and value of every sequence once, so its time is at least
// those bytes over the memory bandwidth — measured in the same run (a device-to-device copy),
// since the data-sheet figure is not what a kernel can reach.
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"
#include "core/device.h"
#include "core/dtype.h"
#include "model/config.h"

namespace prl::bench {

// Bytes a decode step reads, averaged over the decode steps of `batch` sequences with `prompt`
// prompt tokens and `output` generated tokens: the weights in `dtype` (the LM head once, tied
// or not; the input embedding only for its `batch` rows) plus the KV cache in `dtype` at the
// mean context prompt + output / 2.
double MeanDecodeStepBytes(const ModelConfig& config, DType dtype, int64_t batch, int64_t prompt,
                           int64_t output);

// Device memory bandwidth in bytes/s: (read + written bytes) / time of the best of five
// device-to-device copies of `bytes`. UNIMPLEMENTED for a CPU device.
absl::StatusOr<double> MeasureDeviceBandwidth(Device device, int64_t bytes = int64_t{1} << 30);

}  // namespace prl::bench
