// The PyTorch baseline of `prl bench model`: runs bench/torch_model_bench.py (the same decoder
// in plain PyTorch, eager and torch.compile) as a subprocess of the benchmark, on the same
// device, model shape, tokens per step and dtype, and reads back its JSON (tokens/s, TFLOP/s
// by model/flops.h's formula). A mode that failed inside the script (out of memory, no
// compiler for torch.compile) comes back with its error; a script that could not run at all is
// an error of this call.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/device.h"
#include "core/dtype.h"
#include "model/config.h"

namespace prl::bench {

struct TorchBaselineOptions {
  std::string python;                                 // interpreter, e.g. "python3"
  std::string script = "bench/torch_model_bench.py";  // relative to the working directory
  std::string modes = "eager,compile";                // comma-separated
  int64_t tokens = 0;  // per step; a multiple of seq_len (the script runs a B x S batch)
  int64_t seq_len = 0;
  int iterations = 5;  // median reported
  Device device = Device::Cpu();
  DType dtype = DType::kF32;  // F32 (TF32 off) or BF16
  double peak_tflops = 0;     // passed on for the script's MFU; 0: none
};

struct TorchModeResult {
  std::string mode;   // "eager" or "compile"
  std::string error;  // empty when the mode ran
  double forward_tokens_per_s = 0;
  double train_tokens_per_s = 0;  // forward + backward
  double train_tflops = 0;        // model/flops.h FLOPs / time
};

struct TorchBaseline {
  std::string framework;  // "pytorch 2.11.0+cu130"
  std::string attention;  // how the script's attention ran (SDPA with GQA, ...)
  std::vector<TorchModeResult> modes;
};

// The script's command line for `config` (exposed for tests and messages).
std::vector<std::string> TorchBaselineArgv(const ModelConfig& config,
                                           const TorchBaselineOptions& options);

absl::StatusOr<TorchBaseline> RunTorchBaseline(const ModelConfig& config,
                                               const TorchBaselineOptions& options);

}  // namespace prl::bench
