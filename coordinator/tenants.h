// Tenants (docs/tenants.md): who calls the PromptService, and what a tenant may do.
//
// A tenant is a team with a client token of its own (security.tenant_token_files); the
// coordinator's server learns the caller's tenant from the token (rpc/security.h) and passes it
// as a Caller. The operator (the client token, or a server without tokens) may do everything.
// A tenant may only train adapters whose names its limits allow (coordinator.tenants), name
// only the operator's shared agent and environment addresses and its own (never another
// tenant's: actors present the credential configured for an address), sees,
// watches and cancels only its own prompt sets, uses and deletes only adapters it created, and
// holds at most its quotas: running prompt sets, prompts pending or in flight, adapters.
// A call beyond a quota is RESOURCE_EXHAUSTED naming the quota; another tenant's set or adapter
// is NOT_FOUND (its existence is not revealed).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace prl::coordinator {

struct TenantLimits {
  // The adapter names it may train: exact names, or prefixes ending in '*' ("team-a-*").
  std::vector<std::string> adapters;
  // Its own agent and environment addresses: usable by it (and the operator) beside the
  // operator's shared ones (coordinator.agent_addresses, env_addresses), never by another tenant.
  std::vector<std::string> agent_addresses, env_addresses;
  // Quotas; 0: no limit.
  int64_t max_prompt_sets = 0;        // its running prompt sets
  int64_t max_prompts_in_flight = 0;  // prompts pending or leased in its running sets
  int64_t max_adapters = 0;           // live adapters it created
};

// The caller of a PromptService method: a tenant's name, or empty for the operator.
struct Caller {
  std::string tenant;
  bool operator_() const { return tenant.empty(); }
  // Whether the caller may see a set or adapter of `owner` (the operator sees all).
  bool Sees(const std::string& owner) const { return tenant.empty() || tenant == owner; }
};

// The `tenant` label of a tenant's metrics (prl_tenant_*): its name, or "_operator" for what
// was submitted without a tenant's token.
inline std::string TenantLabel(const std::string& tenant) {
  return tenant.empty() ? "_operator" : tenant;
}

// Whether `limits` allow the adapter name; PermissionDenied naming the tenant, the name and
// the allowed names otherwise.
absl::Status CheckAdapterAllowed(const std::string& tenant, const TenantLimits& limits,
                                 const std::string& adapter_name);
// The error of CheckAdapterAllowed, also the answer for another tenant's adapter (whose
// existence is not revealed).
absl::Status AdapterRefused(const std::string& tenant, const TenantLimits& limits,
                            const std::string& adapter_name);

// Reads coordinator.tenants_file: a JSON object of tenant name -> {"adapters": [names or
// prefixes ending in '*'], "agent_addresses": [host:port], "env_addresses": [host:port],
// "max_prompt_sets": n, "max_prompts_in_flight": n, "max_adapters": n} (addresses and quotas
// optional; quotas 0: no limit). Unknown keys and bad values are errors naming them.
absl::StatusOr<std::map<std::string, TenantLimits>> ReadTenantsFile(const std::string& path);

// Validates a tenant's limits (names and patterns well formed, quotas >= 0); errors name
// `field` (e.g. "coordinator.tenants.team-a").
absl::Status ValidateTenantLimits(const TenantLimits& limits, const std::string& field);

}  // namespace prl::coordinator
