// LocalRun: `prl run`, the embedded default. From one config file (config/run_config.h) it
// runs the whole pipeline on this machine as separate processes and reports what RL did:
//
//   1. prepare the run directory; create the model from a preset when model.path is empty;
//   2. supervised warm-start (`prl learner train --loss sft` on the task's examples);
//   3. eval_before: greedy accuracy on held-out prompts;
//   4. start `prl coordinator`, `prl learner serve` (L ranks) and A `prl actor`s, all reading
//      the run's config.json; feed the coordinator train prompts over gRPC as the learner
//      consumes them; print one progress line per learner step (from the learner's report
//      file); restart a crashed actor, learner (it resumes from its checkpoint) or coordinator
//      (its prompt log is durable) up to the configured restart budgets;
//   5. when the learner has taken learner.steps steps: stop the roles, export the final
//      checkpoint (`prl export`), eval_after, and write summary.json.
// Shared-memory segments of the run are removed on every exit path, Ctrl-C included.
//
// With tenants (config.tenants, docs/tenants.md): one warm-start of the shared base on every
// tenant's task alike; each tenant's train prompts go to its own adapter (one learner trains
// them all, the actors serve them all); eval_before, eval_after and the evaluation rounds per
// tenant; each adapter exported to tenants/<name>/adapter-final (PEFT) and merged into
// tenants/<name>/model-final; summary.json lists each tenant and the run's totals.
//
// Run directory: config.json (effective config), model-init/, model-sft/, model-final/,
// sft.jsonl, checkpoints/, coordinator/prompts.log, learner_steps.jsonl, logs/<role>.log,
// summary.json.
#pragma once

#include <atomic>
#include <string>

#include "absl/status/statusor.h"
#include "config/run_config.h"

namespace prl::runner {

struct LocalRunOptions {
  config::RunConfig config;
  std::string prl_path;  // the prl executable the roles are started from
  // Keep the run directory's state (checkpoints, prompt log) and continue; otherwise the
  // run's previous outputs are removed first.
  bool resume = false;
  const std::atomic<bool>* interrupted = nullptr;  // Ctrl-C
};

// Returns the path of summary.json. An interrupted run returns CANCELLED (the run directory
// is kept, for --resume).
absl::StatusOr<std::string> RunLocal(const LocalRunOptions& options);

}  // namespace prl::runner
