// `prl bench model`: training-path throughput of the transformer (forward, and forward +
// backward) on random weights and tokens, beside a GEMM measured in the same run on the shape
// of the model's MLP projection (T x C times C x 2I: OpenBLAS SGEMM on the CPU, the CUDA
// backend's cuBLASLt GEMM in the compute dtype on a GPU). On a GPU also the MFU (model FLOPs
// per second, model/flops.h, over the GPU's peak for the dtype, bench/gpu_peak.h), and with a
// PyTorch interpreter the same model in PyTorch (bench/torch_baseline.h, eager and
// torch.compile), run first in the same process's run so that both see the same GPU.
//
// Timing: each step ends with a device synchronise (the forward's log-probs are copied to the
// host, the backward is followed by one), timed on the host's steady clock after one warm-up
// step; the median of `iterations` steps is reported.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "bench/report.h"
#include "core/device.h"
#include "core/dtype.h"
#include "model/config.h"
#include "model/parameters.h"

namespace prl::bench {

struct ModelBenchOptions {
  int64_t tokens = 2048;  // per step, packed
  int64_t seq_len = 512;  // sequences of this length (the last one may be shorter)
  int iterations = 5;     // timed repetitions of each measurement; the median is reported
  Device device = Device::Cpu();
  DType dtype = DType::kF32;  // BF16: the CUDA bf16 mode (compute weights and activations)
  bool progress = true;       // progress lines on stderr
  // The denominator of MFU, in 1e12 FLOP/s; 0: looked up from the GPU's name (none on the CPU
  // or for a GPU the table lacks: then no MFU is reported).
  double peak_tflops = 0;
  // Non-empty: run the PyTorch baseline with this interpreter first (bench/torch_baseline.h).
  std::string torch_python;
  std::string torch_script = "bench/torch_model_bench.py";
  std::string torch_modes = "eager,compile";
  // CUDA: cuBLASLt algorithm search (kernels::SetGemmAlgorithmSearch) and residual GEMMs
  // (TransformerOptions::residual_in_gemm).
  bool tuned_kernels = false;
  // TransformerOptions::keep_logits: -1 the device's default (the CPU keeps, CUDA recomputes
  // until verified), 0 recompute the logits in the backward, N > 0 keep them (every trained
  // row's in one chunk when they fit N MiB).
  int64_t keep_logits_mb = -1;
  // CUDA: one forward+backward after the timed ones runs between cudaProfilerStart and
  // cudaProfilerStop (for ncu --profile-from-start off); it is not part of the figures.
  bool profile = false;
};

absl::StatusOr<Report> RunModelBench(const ModelConfig& config, const ModelBenchOptions& options);

// Random fp32 weights (seed 1) on `device` (initialised on the host and copied over): the
// weights every benchmark that takes a preset runs on.
absl::StatusOr<ParameterSet> RandomParameters(const ModelConfig& config, Device device);

}  // namespace prl::bench
