// `prl bench e2e --tenants N` (docs/benchmarks.md, "Tenants"): N tenants training their own
// LoRA adapters on one shared base in one `prl run`, against N separate LoRA runs of the same
// task started at once on the same cores (--against separate), or against one LoRA run of one
// adapter alone with the same settings (--against one: what multiplexing N adapters costs; its
// memory baseline is that run's plus N - 1 adapters' weights, gradients and AdamW moments),
// every run from the same warm-started base (the tenants run's). Both sides train learner.steps steps per adapter; the figures are the
// samples and tokens per second over each side's RL phase (from the first RL start to the last
// RL end), the peak memory of all the side's processes during it (their summed proportional set
// sizes, /proc/PID/smaps_rollup: shared segments counted once), the mean lag, and the held-out
// gains. With --flood F, instead: the tenants run, then the same run from its warm model where
// tenant t0 asks for F times the prompts of each other (cli/bench_flood.h); the figures are each
// tenant's samples/s while all of them train and its share of the fair share (their sum / N).
#pragma once

#include <atomic>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace prl::cli {

struct TenantsBenchFlags {
  std::string config_file, run_dir;
  std::vector<std::string> overrides;
  int tenants = 4;
  std::string against = "separate";  // or "one"
  // >= 2: t0 floods (F times the others' prompts) against the same run without a flood.
  int flood = 0;
  bool json = false;
};

// `interrupted` (Ctrl-C) stops every run it started.
absl::Status RunTenantsBench(const TenantsBenchFlags& flags, const std::atomic<bool>& interrupted);

}  // namespace prl::cli
