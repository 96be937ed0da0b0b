// The PyTorch baselines of the benchmarks, each a script run as a subprocess of the benchmark
// on the same device, model shape and dtype, whose JSON result is read back:
//  - `prl bench model`: bench/torch_model_bench.py, the same decoder in plain PyTorch (eager
//    and torch.compile) at the same tokens per step (tokens/s, TFLOP/s by model/flops.h's
//    formula);
//  - `prl bench engine`: bench/torch_decode_bench.py, KV-cache generation in plain PyTorch (a
//    static preallocated cache, SDPA prefill, a decode step eager or captured in a CUDA graph,
//    temperature-1 sampling with log-probs) at the same batch, prompt and output lengths
//    (prefill time, decode tokens/s, ms per decode step).
// A mode that failed inside a script (out of memory, no compiler for torch.compile, a CUDA
// graph capture error, "needs CUDA" on the CPU) comes back with its error; a script that could
// not run at all is an error of the call.
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

struct TorchDecodeOptions {
  std::string python;                                  // interpreter, e.g. "python3"
  std::string script = "bench/torch_decode_bench.py";  // relative to the working directory
  std::string modes = "eager,graph";                   // comma-separated
  int64_t batch = 1;                                   // sequences generated together
  int64_t prompt = 0;                                  // random prompt tokens per sequence
  int64_t output = 0;             // decode steps timed (one token per sequence each)
  int warmup = 3;                 // decode steps of the untimed warm-up generation
  uint64_t seed = 1;              // weights, prompts and sampling
  Device device = Device::Cpu();  // on the CPU only "eager" runs ("graph": needs CUDA)
  DType dtype = DType::kF32;      // F32 (TF32 off) or BF16
};

struct TorchDecodeMode {
  std::string mode;                // "eager" or "graph"
  std::string error;               // empty when the mode ran
  double prefill_s = 0;            // the B prompts, first token sampled
  double decode_s = 0;             // all `output` decode steps
  double decode_tokens_per_s = 0;  // batch * output / decode_s
  double step_ms = 0;              // median decode step
};

struct TorchDecodeResult {
  std::string framework;  // "pytorch 2.11.0+cu130"
  std::string device;     // the GPU's name, or "cpu"
  std::string attention;  // how the script's attention ran
  std::string sampling;   // where and how it sampled
  std::vector<TorchDecodeMode> modes;
};

// The decode script's command line for `config` (exposed for tests and messages).
std::vector<std::string> TorchDecodeArgv(const ModelConfig& config,
                                         const TorchDecodeOptions& options);

absl::StatusOr<TorchDecodeResult> RunTorchDecodeBaseline(const ModelConfig& config,
                                                         const TorchDecodeOptions& options);

}  // namespace prl::bench
