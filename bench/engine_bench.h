// `prl bench engine`: the engine's prefill and decode throughput at several batch sizes
// (prompt 128, output 128 by default), each beside the same model's training-forward
// throughput measured in the same run, and decode throughput under a stream of in-flight
// weight swaps beside decode without swaps.
#pragma once

#include <cstdint>
#include <memory>
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
  EngineOptions engine;  // block size, KV pool, batch-invariant mode, device
  bool progress = true;
};

absl::StatusOr<Report> RunEngineBench(std::shared_ptr<const ParameterSet> weights,
                                      const EngineBenchOptions& options);

}  // namespace prl::bench
