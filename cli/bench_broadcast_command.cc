// `prl bench broadcast` (bench/broadcast_bench.h): its flags, and the hidden subscriber mode
// the benchmark starts as a second process.

#include <cstdio>
#include <memory>

#include "bench/broadcast_bench.h"
#include "cli/command.h"
#include "core/status_macros.h"

namespace prl::cli {

namespace {

struct BroadcastBenchFlags {
  bench::BroadcastBenchOptions options;
  std::string device = "auto", dtype = "fp32";
  bool json = false;
  bool subscriber = false;  // the benchmark's second process
  std::string run_name, listen;
};

absl::Status RunBroadcastBench(BroadcastBenchFlags f) {
  PRL_ASSIGN_OR_RETURN(f.options.device, ResolveDeviceFlag(f.device));
  PRL_ASSIGN_OR_RETURN(f.options.dtype, ResolveComputeDType(f.dtype, f.options.device));
  if (f.subscriber) {
    if (f.options.configs.size() != 1 || f.options.transports.size() != 1) {
      return absl::InvalidArgumentError(
          "bench broadcast --subscriber: one --configs and one --transports");
    }
    bench::BroadcastSubscriberOptions s;
    s.config = f.options.configs[0];
    s.transport = f.options.transports[0];
    s.run_name = f.run_name;
    s.listen = f.listen;
    s.device = f.options.device;
    s.dtype = f.options.dtype;
    s.versions = f.options.versions;
    s.batch = f.options.batch;
    s.adapter_rank = f.options.adapter_rank;
    return bench::RunBroadcastSubscriber(s);
  }
  f.options.prl_path = SelfPath();
  PRL_ASSIGN_OR_RETURN(const bench::Report report, bench::RunBroadcastBench(f.options));
  std::printf("%s\n", f.json ? report.ToJson().c_str() : report.ToTable().c_str());
  return absl::OkStatus();
}

}  // namespace

void RegisterBroadcastBench(CLI::App* bench, CommandRegistry& registry) {
  auto f = std::make_shared<BroadcastBenchFlags>();
  CLI::App* cmd = bench->add_subcommand(
      "broadcast",
      "Weight swaps: publish-to-swapped latency per model and transport (a second prl process "
      "decoding meanwhile) vs one copy of the weights, and the generation stall a swap causes "
      "vs a step without one");
  cmd->add_option("--configs", f->options.configs, "Model presets")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--transports", f->options.transports,
                  "shm, grpc, cuda_ipc (default: shm,grpc, and cuda_ipc on CUDA)")
      ->delimiter(',');
  cmd->add_option("--device", f->device, "auto, cpu, cuda or cuda:N")->capture_default_str();
  cmd->add_option("--dtype", f->dtype, "The subscriber engine's dtype: fp32 | bf16 (CUDA)")
      ->capture_default_str();
  cmd->add_option("--versions", f->options.versions, "Swaps timed per model and transport")
      ->capture_default_str();
  cmd->add_option("--batch", f->options.batch, "Sequences the subscriber decodes meanwhile")
      ->capture_default_str();
  cmd->add_option("--adapter-rank", f->options.adapter_rank,
                  "Also time a LoRA learner's versions: an all-linear adapter of this rank "
                  "published alone, beside the full model (0: none; CPU)")
      ->capture_default_str();
  cmd->add_option("--work-dir", f->options.work_dir, "Where the subscribers' logs go")
      ->capture_default_str();
  cmd->add_flag("--json", f->json, "Print one JSON object instead of the table");
  cmd->add_flag("--subscriber", f->subscriber)->group("");  // hidden: the second process
  cmd->add_option("--run-name", f->run_name)->group("");
  cmd->add_option("--listen", f->listen)->group("");
  registry.Add(cmd, [f] { return RunBroadcastBench(*f); });
}

}  // namespace prl::cli
