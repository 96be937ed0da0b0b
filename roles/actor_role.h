// The actor role (`prl actor`): one actor server built from the run config. It loads the
// model (model.path) onto its device (actors.device, actors.dtype: the CPU or the CUDA
// engine), writes finished groups to the run's replay segment (waiting for the learner to
// create it) or to a remote ingest (replay.address), receives weights over the run's transport
// (broadcast.transport), serves /metrics, and generates until the stop flag is set.
#pragma once

#include <atomic>
#include <string>

#include "absl/status/status.h"
#include "config/run_config.h"

namespace prl::roles {

struct ActorRoleOptions {
  std::string name;  // in logs, records and the coordinator; empty: <hostname>-<pid>
};

absl::Status RunActorRole(const config::RunConfig& config, const ActorRoleOptions& options,
                          const std::atomic<bool>& stop);

}  // namespace prl::roles
