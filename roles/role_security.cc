#include "roles/role_security.h"

#include <cstdio>

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
  r.cert_refresh_s = s.cert_refresh_s;
  return r;
}

absl::Status ConfigureRoleSecurity(const config::RunConfig& config, std::optional<rpc::Role> self,
                                   std::set<rpc::Role> admitted) {
  rpc::SecuritySettings settings = SecuritySettingsFrom(config.security);
  if (self.has_value()) admitted.insert(*self);
  if (!admitted.contains(rpc::Role::kClient)) settings.client_token_file.clear();
  if (!admitted.contains(rpc::Role::kActor)) settings.actor_token_file.clear();
  if (!admitted.contains(rpc::Role::kLearner)) settings.learner_token_file.clear();
  PRL_RETURN_IF_ERROR(rpc::ConfigureSecurity(settings, self));
  std::fprintf(stderr, "security: %s\n", rpc::DescribeSecurity().c_str());
  return absl::OkStatus();
}

}  // namespace prl::roles
