// `prl bench engine`: the engine's prefill and decode throughput at several batch sizes
// (prompt 128, output 128 by default), each beside the same model's training-forward
// throughput measured in the same run, and decode throughput under a stream of in-flight
// weight swaps beside decode without swaps.
//
// On CUDA, each decode figure also stands beside the HBM roofline (bench/decode_roofline.h:
// the weight and KV bytes a step must read over the bandwidth measured in this run) and, with
// a Python that has torch, beside a PyTorch KV-cache generation loop of the same model
// (bench/torch_decode_bench.py, eager and CUDA-graph modes); batch 1 is also run without CUDA
// graphs, a weight swap's cost (a copy into the captured weights) stands beside a graph
// capture's, --invariant-cost adds the batch-invariant mode beside the fast one and
// --tuned-cost the tuned decode kernels (EngineOptions::tuned_kernels) flipped beside the main
// figure; with --norm-in-gemm (EngineOptions::norm_in_gemm) the main figure stands beside the
// same kernels with the RMSNorms as kernels of their own. With --adapters N (CPU), decode also
// runs with N LoRA adapters of rank --adapter-rank on every projection (all-linear), the
// requests spread over them in one batch (Engine::AddAdapter), beside the base model alone in
// the same run (runs alternating).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "bench/report.h"
#include "inference_engine/engine.h"
#include "model/parameters.h"

namespace prl::bench {

struct EngineBenchOptions {
  int64_t prompt_len = 128;
  int64_t output_len = 128;
  std::vector<int64_t> batches = {1, 16, 64};
  // A new weight version is loaded (copied into a spare buffer) and swapped in this often
  // during the swap measurement; 0 skips it.
  // A learner step of the CPU benchmark model takes several seconds, so one swap per second is
  // already a denser stream than training produces here.
  int64_t swap_interval_ms = 1000;
  int iterations = 3;    // runs per batch size; the best phase times are kept
  int adapters = 0;          // > 0: also decode with this many LoRA adapters mixed in a batch
  int64_t adapter_rank = 16;
  EngineOptions engine;  // block size, KV pool, batch-invariant mode, device, dtype, graphs
  bool progress = true;
  // CUDA only:
  std::string torch_python;  // non-empty: run the PyTorch decode baseline with it
  std::string torch_script = "bench/torch_decode_bench.py";
  std::string torch_modes = "eager,graph";
  bool invariant_cost = false;  // also decode in the batch-invariant mode
  bool tuned_cost = false;      // also decode with engine.tuned_kernels flipped
  // > 0: decode step N of each batch's first measured run runs between cudaProfilerStart and
  // cudaProfilerStop, so that `ncu --profile-from-start off` profiles that one step's kernels.
  int64_t profile_step = 0;
};

absl::StatusOr<Report> RunEngineBench(std::shared_ptr<const ParameterSet> weights,
                                      const EngineBenchOptions& options);

}  // namespace prl::bench
