// `prl bench learner`: tokens/s and achieved GFLOP/s of full learner steps (forward, loss,
// backward, FSDP collectives, AdamW) on random weights and rollouts, for each world size (local
// ranks as separate processes over Gloo, or over NCCL on GPUs), beside the GEMM measured in the
// same run on the model's MLP shape (OpenBLAS SGEMM on the CPU; on a GPU cuBLASLt in the
// compute dtype, measured by rank 0 on its GPU); plus each rank's memory for parameters,
// gradients, optimizer state, unit buffers and (mixed precision) the bf16 compute copies, and
// its peak pass workspace (activations and scratch). With several rollout lengths or
// activation checkpointing modes, every (length, mode, world size) is measured, each mode
// beside the first mode's figures of the same length and world size.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "bench/report.h"
#include "core/device.h"
#include "core/dtype.h"
#include "model/activation_checkpointing.h"
#include "model/context_parallel.h"
#include "model/config.h"

namespace prl::bench {

struct LearnerBenchOptions {
  int64_t tokens = 2048;  // input tokens per step, all ranks together (at least one rollout)
  // Rollout lengths, each measured: 32 prompt tokens + the rest completion.
  std::vector<int64_t> seq_lens = {512};
  // learner.activation_checkpointing modes, each measured for every length (the first, none
  // where listed, is the others' baseline), with each pass's peak workspace per rank.
  std::vector<ActivationCheckpointing> checkpointing = {ActivationCheckpointing::kNone};
  // learner.context_parallel group sizes C, each measured at world sizes D x C for D in
  // world_sizes (the data-parallel groups); a group of C > 1 beside one rank (C = 1, world size
  // 1) of the same length and mode.
  std::vector<int> context_parallel = {1};
  // learner.context_parallel_attention variants, each measured for every C > 1 (the first is the
  // others' baseline at the same C, world size, length and mode).
  std::vector<ContextAttention> context_attention = {ContextAttention::kAllGather};
  int iterations = 3;     // timed steps per world size (median reported), after one warm-up
  std::vector<int> world_sizes = {1, 2};  // with context_parallel: data-parallel groups
  // Where the ranks run (the CPU over Gloo, or rank r on GPU r over NCCL: roles/learner_rank.h)
  // and the compute dtype (BF16: the mixed-precision mode, CUDA only).
  DeviceType device = DeviceType::kCpu;
  DType dtype = DType::kF32;
  bool progress = true;
};

// The launcher: runs the ranks for every world size by re-executing `argv` (this command line)
// and collects what rank 0 reports.
absl::StatusOr<Report> RunLearnerBench(const ModelConfig& config,
                                       const LearnerBenchOptions& options,
                                       const std::vector<std::string>& argv);

// Inside a rank started by RunLearnerBench: runs the steps and, on rank 0, writes the figures
// to the file the launcher named. NotFound when this process is not a rank.
absl::Status RunLearnerBenchRank(const ModelConfig& config, const LearnerBenchOptions& options);

}  // namespace prl::bench
