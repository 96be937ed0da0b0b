// A role's trust settings from the run config's `security` section, made the process's
// (rpc/security.h) before the role starts a server or opens a channel.
#pragma once

#include <optional>

#include "absl/status/status.h"
#include "config/run_config.h"
#include "rpc/security.h"

namespace prl::roles {

rpc::SecuritySettings SecuritySettingsFrom(const config::SecuritySection& security);

// `self`: the role this process calls others as (its token goes with every call); nullopt for
// a process that only serves (the coordinator, the reward service).
absl::Status ConfigureRoleSecurity(const config::RunConfig& config, std::optional<rpc::Role> self);

}  // namespace prl::roles
