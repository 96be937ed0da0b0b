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
// never a token). A role whose token would go in plaintext to a server address of the config
// that is not loopback (rpc::TokenMayTravelTo: no security.tls_ca_file) is refused
// (FailedPrecondition naming the key and the address): the coordinator for every role, and
// for actors the remote replay ingest and the grpc weight service. Environments and remote
// rewards are user-written and get no role token: an actor presents
// security.service_token_files[address] to them (also refused in plaintext off loopback), and
// prl's own (prl env serve, prl reward serve) admit the service role.
absl::Status ConfigureRoleSecurity(const config::RunConfig& config, std::optional<rpc::Role> self,
                                   std::set<rpc::Role> admitted);

}  // namespace prl::roles
