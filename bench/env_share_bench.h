// `prl bench env-share`: how much of an actor a healthy environment's prompt set keeps beside a
// set whose environment hangs (accepts every call, never answers), against the same set alone,
// in the same run (docs/environments.md, "Sharing an actor").
//
// Each mode runs the real thing in one process: a Coordinator behind its gRPC server on
// loopback, one Actor (a tiny random model over the built-in character vocabulary; groups
// scored and dropped instead of written), and an EnvironmentServer on loopback hosting the
// built-in guessing game ("healthy") and an environment whose Step never returns ("hung").
//   alone   the healthy set runs by itself;
//   beside  the hung set is submitted first and holds every one of the actor's prompt slots
//           (the bench waits until it does), then the healthy set is submitted.
// The figure is the healthy set's prompts completed per second from its submission to its last
// prompt; the ratio beside / alone is what the hung set leaves it (the fair share: at least 0.5).
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "bench/report.h"

namespace prl::bench {

struct EnvShareBenchOptions {
  int prompts = 512;  // of the healthy set
  int samples_per_prompt = 4;
  int max_prompts_in_flight = 8;  // the actor's slots
  int max_turns = 4;
  bool progress = true;
};

absl::StatusOr<Report> RunEnvShareBench(const EnvShareBenchOptions& options);

}  // namespace prl::bench
