#include "roles/role_security.h"

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

absl::Status ConfigureRoleSecurity(const config::RunConfig& config,
                                   std::optional<rpc::Role> self) {
  return rpc::ConfigureSecurity(SecuritySettingsFrom(config.security), self);
}

}  // namespace prl::roles
