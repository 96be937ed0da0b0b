// `prl bench broadcast`: how long a new weight version takes from the learner's Publish to an
// actor generating with it, per model and transport, and how long generation stalls for it.
//
// The publisher runs in this process; the subscriber is a second prl process (an actor's
// shape: its own engine decoding a batch while versions arrive; cuda_ipc handles can only be
// opened by another process). For every version the publisher notes the time, publishes, and
// waits for the subscriber to report the end of its first engine step on that version (both
// on CLOCK_MONOTONIC, one clock for every process of the machine):
//
//   publish_to_swapped  Publish's start -> the first step on the new weights has finished
//                       (transfer, the engine's copy into its weights, one step): median
//   publish             the Publish call alone (what the learner's step loop waits for)
//   swap_stall          the step that applied a swap minus the median step without one
//
// Baselines measured in the same run: one copy of the weights on the device (cudaMemcpy, or
// memcpy on the CPU) for the two latencies, and the median step without a swap for the stall.
//
// --adapter-rank R (CPU): also, beside each model's rows in the same run, the versions of a LoRA
// learner: an all-linear adapter of rank R published alone (weight_transport.h's WeightSpec with
// an adapter), the subscriber's engine swapping it onto its base (Engine::SwapAdapter). Its rows
// ("<preset>_<transport>_lora_r<R>") have the full model's same measure as their baseline, and
// version_bytes rows give the bytes of one version of each.
//
// Transports: shm and grpc, and cuda_ipc on CUDA (nccl needs one process per GPU). The child
// is `prl bench broadcast --subscriber ...` (RunBroadcastSubscriber), which prints one line per
// event on stdout: "ready V", "swapped V T_NS", "steps NORMAL_MEDIAN_MS SWAP_MEAN_MS".
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "bench/report.h"
#include "core/device.h"
#include "core/dtype.h"
#include "model/lora.h"

namespace prl::bench {

struct BroadcastBenchOptions {
  std::vector<std::string> configs = {"40m"};  // presets (model/presets.h)
  std::vector<std::string> transports;         // empty: shm, grpc, and cuda_ipc on CUDA
  Device device = Device::Cpu();               // the publisher's and the subscriber's
  DType dtype = DType::kF32;                   // the subscriber engine's compute dtype
  int versions = 5;                            // swaps timed per model and transport
  int64_t batch = 16;                          // sequences the subscriber decodes meanwhile
  std::string prl_path;                        // the binary started as the subscriber
  std::string work_dir = "/tmp";               // the subscribers' logs
  bool progress = true;                        // a line per model and transport on stderr
  int64_t adapter_rank = 0;                    // > 0: also an adapter of this rank (CPU)
};

absl::StatusOr<Report> RunBroadcastBench(const BroadcastBenchOptions& options);

// The subscriber side (run by the child process).
struct BroadcastSubscriberOptions {
  std::string config;     // a preset
  std::string transport;  // shm, grpc or cuda_ipc
  std::string run_name;   // names the transport's shared-memory segments
  std::string listen;     // grpc: the publisher's address
  Device device = Device::Cpu();
  DType dtype = DType::kF32;
  int versions = 5;  // exits after this many swaps
  int64_t batch = 16;
  int64_t adapter_rank = 0;  // > 0: the versions are an adapter of this rank on the base
};

// The all-linear LoRA adapter of `rank` the benchmark publishes (alpha 2 r).
LoraConfig BenchAdapter(int64_t rank);

absl::Status RunBroadcastSubscriber(const BroadcastSubscriberOptions& options);

}  // namespace prl::bench
