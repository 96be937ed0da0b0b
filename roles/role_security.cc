#include "roles/role_security.h"

#include <algorithm>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/net_address.h"
#include "core/status_macros.h"

namespace prl::roles {

rpc::SecuritySettings SecuritySettingsFrom(const config::SecuritySection& s) {
  rpc::SecuritySettings r;
  r.tls_cert_file = s.tls_cert_file;
  r.tls_key_file = s.tls_key_file;
  r.tls_ca_file = s.tls_ca_file;
  r.require_client_cert = s.require_client_cert;
  r.insecure = s.insecure;
  r.client_token_file = s.client_token_file;
  r.actor_token_file = s.actor_token_file;
  r.learner_token_file = s.learner_token_file;
  r.service_token_file = s.service_token_file;
  r.service_token_files = s.service_token_files;
  r.tenant_token_files = s.tenant_token_files;
  r.cert_refresh_s = s.cert_refresh_s;
  return r;
}

namespace {

// The server addresses of the config a role calls, as (key, address).
std::vector<std::pair<std::string, std::string>> CalledAddresses(const config::RunConfig& c,
                                                                 rpc::Role self) {
  std::vector<std::pair<std::string, std::string>> called = {
      {c.coordinator.address.empty() ? "coordinator.listen" : "coordinator.address",
       c.coordinator_address()}};
  if (self != rpc::Role::kActor) return called;
  // An address naming {rank} (a run of adapters' learner ranks on nodes of their own) stands for
  // each rank's: every one of them is checked (at least ranks 0 and 1).
  const auto each_rank = [&](const std::string& key, const std::string& address) {
    if (!absl::StrContains(address, config::kLearnerRankPlaceholder)) {
      called.emplace_back(key, address);
      return;
    }
    for (int32_t rank = 0; rank < std::max(c.learner.world_size, 2); ++rank) {
      called.emplace_back(key, config::AtLearnerRank(address, rank));
    }
  };
  if (!c.replay.address.empty()) each_rank("replay.address", c.replay.address);
  if (c.broadcast.transport == config::WeightTransport::kGrpc) {
    each_rank(c.broadcast.address.empty() ? "broadcast.listen" : "broadcast.address",
              c.weights_address());
  }
  // (Environments and remote rewards are user-written: they never get the actor's token.)
  return called;
}

}  // namespace

absl::Status ConfigureRoleSecurity(const config::RunConfig& config, std::optional<rpc::Role> self,
                                   std::set<rpc::Role> admitted) {
  rpc::SecuritySettings settings = SecuritySettingsFrom(config.security);
  if (self.has_value()) admitted.insert(*self);
  if (!admitted.contains(rpc::Role::kClient)) {
    settings.client_token_file.clear();
    settings.tenant_token_files.clear();  // tenants are clients
  }
  if (!admitted.contains(rpc::Role::kActor)) settings.actor_token_file.clear();
  if (!admitted.contains(rpc::Role::kLearner)) settings.learner_token_file.clear();
  if (!admitted.contains(rpc::Role::kService)) settings.service_token_file.clear();
  if (self != rpc::Role::kActor) settings.service_token_files.clear();  // only actors call them
  for (const auto& [address, file] : settings.service_token_files) {
    if (!settings.tls_ca_file.empty() || IsLoopbackEndpoint(address)) continue;
    return absl::FailedPreconditionError(absl::StrCat(
        "security.service_token_files['", address,
        "']: the credential would go in plaintext to "
        "an address that is not loopback; set security.tls_ca_file (with TLS on that service) "
        "or reach it on loopback"));
  }
  PRL_RETURN_IF_ERROR(rpc::ConfigureSecurity(settings, self));
  if (self.has_value()) {
    for (const auto& [key, address] : CalledAddresses(config, *self)) {
      if (rpc::TokenMayTravelTo(address)) continue;
      const std::string role(EnumName(rpc::kRoleNames, *self));
      const absl::Status refused = absl::FailedPreconditionError(absl::StrCat(
          key, " '", address, "': the ", role, " would send its bearer token (security.", role,
          "_token_file) in plaintext to an address that is not loopback; set "
          "security.tls_ca_file (with TLS on the servers) or reach the server on loopback"));
      rpc::ConfigureSecurity({}, std::nullopt).IgnoreError();  // no token stays configured
      return refused;
    }
  }
  std::fprintf(stderr, "security: %s\n", rpc::DescribeSecurity().c_str());
  return absl::OkStatus();
}

}  // namespace prl::roles
