// `prl bench learner --adapters N` (docs/benchmarks.md, "Adapters on learner ranks"): the
// learner of a run of adapters (roles/adapter_learner.h) on its own, N LoRA adapters on one
// frozen base, each rank training the adapters placed on it (N / world size each, as the
// coordinator places them: the least loaded rank) one step after another over a world of one,
// the ranks of the node mapping one base file. For each world size: the adapters' aggregate
// training tokens/s (every rank's steps together, from the first step's start to the last
// one's end), beside world size 1 measured in the same run; and the same adapters' joint steps
// (learner/joint_step.h: every adapter of a rank in one set of passes over the base, as the
// learner role runs them on the CPU) beside their steps one after another, also in the same run.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "bench/report.h"
#include "model/config.h"

namespace prl::bench {

struct AdapterLearnerBenchOptions {
  int adapters = 4;                // on the base, all ranks together
  int64_t adapter_rank = 8;        // each adapter's LoRA rank (all-linear targets)
  int64_t tokens = 2048;           // input tokens per adapter step
  int64_t seq_len = 256;           // rollout length (32 prompt tokens)
  int steps = 3;                   // timed steps per adapter, after one warm-up step each
  std::vector<int> world_sizes = {1, 2};
  // OpenMP threads per rank; 0: the machine's cores shared (cores / world size each).
  int threads_per_rank = 0;
  int64_t pass_tokens = 4096;  // the joint steps' learner.adapter_pass_tokens
  bool progress = true;
};

// The launcher: runs the ranks for every world size by re-executing `argv`.
absl::StatusOr<Report> RunAdapterLearnerBench(const ModelConfig& config,
                                              const AdapterLearnerBenchOptions& options,
                                              const std::vector<std::string>& argv);

// Inside a rank started by RunAdapterLearnerBench: NotFound when this process is not one.
absl::Status RunAdapterLearnerBenchRank(const ModelConfig& config,
                                        const AdapterLearnerBenchOptions& options);

}  // namespace prl::bench
