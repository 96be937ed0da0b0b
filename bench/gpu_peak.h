// Peak dense FLOP/s of the GPUs prl is benchmarked on: the denominator of MFU (model FLOPs
// utilisation = the model's FLOPs per second, counted by model/flops.h, over the device's peak).
//
// The bf16 mode is measured against the dense (no 2:4 sparsity) bf16 tensor-core peak with
// fp32 accumulation, the fp32 mode against the fp32 non-tensor-core (SIMT) peak — prl's fp32
// mode uses no TF32. Figures are NVIDIA's data-sheet numbers at boost clock; a GPU missing from
// the table gets no MFU unless `prl bench model --peak-tflops` names its peak.
#pragma once

#include <optional>
#include <string>

#include "absl/strings/string_view.h"
#include "core/dtype.h"

namespace prl::bench {

struct GpuPeak {
  std::string label;  // e.g. "H100 SXM bf16 dense"
  double tflops = 0;  // peak, 1e12 FLOP/s
};

// Looks up `gpu_name` (cudaGetDeviceProperties' name, e.g. "NVIDIA H100 80GB HBM3") for the
// compute dtype (BF16 or F32). nullopt for a GPU or dtype the table does not know.
std::optional<GpuPeak> LookupGpuPeak(absl::string_view gpu_name, DType dtype);

}  // namespace prl::bench
