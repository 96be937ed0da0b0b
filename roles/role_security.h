// A role's trust settings from the run config's `security` section, made the process's
// (rpc/security.h) before the role starts a server or opens a channel.
#pragma once

#include <optional>
#include <set>

#include "absl/status/status.h"
#include "config/run_config.h"
#include "rpc/security.h"

namespace prl::roles {

rpc::SecuritySettings SecuritySettingsFrom(const config::SecuritySection& security);

// `self`: the role this process calls others as (its token goes with every call); nullopt for
// a process that only serves (the coordinator, the reward service). `admitted`: the roles its
// servers admit. A process reads only the token files of `self` and `admitted` (least
// privilege: an actor's pod needs no learner token), so a token of another role is unknown
// to its servers (UNAUTHENTICATED). Says on stderr what it configured (rpc::DescribeSecurity:
// never a token).
absl::Status ConfigureRoleSecurity(const config::RunConfig& config, std::optional<rpc::Role> self,
                                   std::set<rpc::Role> admitted);

}  // namespace prl::roles
