// `prl bench coordinator`: durable completions per second and lease latency of a coordinator
// under many concurrent actors, with group commit (completions share the prompt log's fsyncs)
// beside an fsync per request (the baseline), in the same run.
//
// Each mode runs the real thing in one process: a Coordinator with its durable prompt log in
// `dir` (on disk: the fsync is what is measured) behind a CoordinatorServer on loopback, and
// `actors` actors, each with a gRPC channel of its own and one call outstanding, that register
// and then loop Lease (one prompt) and Complete until the time is up; they are driven by gRPC's
// callback API, so the client side takes no thread per actor from the server's CPU. A
// completion counts once Complete returned OK, i.e. once it is durable. Lease latency is the
// client's round trip of a call that leased a prompt; calls that failed or leased nothing are
// counted as errors (a result row), never timed. A third mode runs group commit with the log on
// tmpfs (/dev/shm), where an fsync costs nothing: the ceiling gRPC and the coordinator leave,
// and so the most any batching of fsyncs could gain over an fsync per request on this machine.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "bench/report.h"

namespace prl::bench {

struct CoordinatorBenchOptions {
  int actors = 64;
  double seconds = 5.0;  // measured per mode, after a warm-up of a tenth of it
  int samples_per_prompt = 4;
  // Prompts of a set no actor can run, submitted first (so at the head of the queue): the
  // actors declare a capacity of samples_per_prompt and this set asks for twice as many.
  int64_t unrunnable_prompts = 0;
  std::string dir;  // where the logs go (removed after); empty: a temporary directory
  bool progress = true;
};

absl::StatusOr<Report> RunCoordinatorBench(const CoordinatorBenchOptions& options);

}  // namespace prl::bench
