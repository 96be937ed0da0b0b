// How `prl run` starts the roles: the role config file every process reads (the run's
// effective config with the start model, the resolved ports and the learner's report file),
// and the command line, log and environment of each process — its CPU thread budget and its
// GPUs (runner/gpu_plan.h).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "config/run_config.h"
#include "core/child_process.h"

namespace prl::runner {

struct RoleSpecs {
  config::RunConfig role_config;  // what config.json holds
  std::string role_config_path;   // <run dir>/config.json
  ChildSpec coordinator, learner;
  std::vector<ChildSpec> actors;
  std::vector<std::string> lines;  // what prl run prints: endpoints, GPU placement
};

// Resolves ports (a listen address with port 0 gets a free port; metrics.base_port), plans
// the GPUs, writes <run dir>/config.json and returns every process's spec.
absl::StatusOr<RoleSpecs> PrepareRoles(const config::RunConfig& config,
                                       const std::string& start_model, const std::string& prl_path);

// The roles share this machine's cores: each gets an OpenMP thread budget so that together
// they do not oversubscribe the cores, and OpenMP threads sleep rather than spin while they
// wait (a spinning team on a shared core starves the other processes). Variables the user
// set win.
std::vector<std::pair<std::string, std::string>> ThreadEnv(int threads);
int Cores();

// The last `max_bytes` of a log, for error messages.
std::string TailOfFile(const std::string& path, size_t max_bytes = 2000);

}  // namespace prl::runner
