#include "coordinator/tenants.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "coordinator/adapters.h"
#include "coordinator/field_error.h"
#include "core/status_macros.h"

namespace prl::coordinator {

absl::Status CheckAdapterAllowed(const std::string& tenant, const TenantLimits& limits,
                                 const std::string& adapter_name) {
  for (const std::string& allowed : limits.adapters) {
    if (absl::EndsWith(allowed, "*")
            ? absl::StartsWith(adapter_name, allowed.substr(0, allowed.size() - 1))
            : adapter_name == allowed) {
      return absl::OkStatus();
    }
  }
  return AdapterRefused(tenant, limits, adapter_name);
}

absl::Status AdapterRefused(const std::string& tenant, const TenantLimits& limits,
                            const std::string& adapter_name) {
  return absl::PermissionDeniedError(absl::StrCat(
      "adapter.name: tenant '", tenant, "' may train the adapters ",
      limits.adapters.empty() ? std::string("(none listed)") : absl::StrJoin(limits.adapters, ", "),
      " (coordinator.tenants.", tenant, ".adapters), found '", adapter_name, "'"));
}

absl::StatusOr<std::map<std::string, TenantLimits>> ReadTenantsFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    return absl::FailedPreconditionError(
        absl::StrCat("coordinator.tenants_file: cannot read '", path, "'"));
  }
  std::stringstream text;
  text << in.rdbuf();
  const nlohmann::json json =
      nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  const std::string file = absl::StrCat("coordinator.tenants_file '", path, "'");
  if (json.is_discarded() || !json.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(file, ": expected a JSON object of tenant name -> limits"));
  }
  std::map<std::string, TenantLimits> out;
  for (const auto& [tenant, value] : json.items()) {
    const std::string field = absl::StrCat("coordinator.tenants.", tenant.substr(0, 64));
    if (tenant.empty() || !value.is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat(file, ": ", field, ": expected a tenant name and an object of its limits"));
    }
    TenantLimits limits;
    for (const auto& [key, v] : value.items()) {
      int64_t* quota = key == "max_prompt_sets"         ? &limits.max_prompt_sets
                       : key == "max_prompts_in_flight" ? &limits.max_prompts_in_flight
                       : key == "max_adapters"          ? &limits.max_adapters
                                                        : nullptr;
      std::vector<std::string>* list = key == "adapters"          ? &limits.adapters
                                       : key == "agent_addresses" ? &limits.agent_addresses
                                       : key == "env_addresses"   ? &limits.env_addresses
                                                                  : nullptr;
      if (list != nullptr) {
        if (!v.is_array()) {
          return Invalid(absl::StrCat(field, ".", key), "an array of strings", v.dump());
        }
        for (const nlohmann::json& name : v) {
          if (!name.is_string()) {
            return Invalid(absl::StrCat(field, ".", key), "strings", name.dump());
          }
          list->push_back(name.get<std::string>());
        }
      } else if (quota != nullptr) {
        if (!v.is_number_integer()) {
          return Invalid(absl::StrCat(field, ".", key), "an integer >= 0", v.dump());
        }
        *quota = v.get<int64_t>();
      } else {
        return Invalid(absl::StrCat(field, ".", key.substr(0, 64)),
                       "one of adapters, agent_addresses, env_addresses, max_prompt_sets, "
                       "max_prompts_in_flight, max_adapters",
                       "an unknown key");
      }
    }
    PRL_RETURN_IF_ERROR(ValidateTenantLimits(limits, field));
    out[tenant] = std::move(limits);
  }
  return out;
}

absl::Status ValidateTenantLimits(const TenantLimits& limits, const std::string& field) {
  for (size_t i = 0; i < limits.adapters.size(); ++i) {
    std::string name = limits.adapters[i];
    if (absl::EndsWith(name, "*")) {
      name.pop_back();
      if (name.empty()) continue;  // "*": every name
    }
    PRL_RETURN_IF_ERROR(ValidateAdapterName(name, absl::StrCat(field, ".adapters[", i, "]")));
  }
  for (const auto* list : {&limits.agent_addresses, &limits.env_addresses}) {
    const char* key = list == &limits.agent_addresses ? "agent_addresses" : "env_addresses";
    for (size_t i = 0; i < list->size(); ++i) {
      const std::string& address = (*list)[i];
      if (address.empty() || address.size() > 256 || address.find(':') == std::string::npos) {
        return Invalid(absl::StrCat(field, ".", key, "[", i, "]"), "host:port",
                       absl::StrCat("'", address.substr(0, 64), "'"));
      }
    }
  }
  const auto quota = [&](int64_t value, const char* key) -> absl::Status {
    if (value >= 0) return absl::OkStatus();
    return Invalid(absl::StrCat(field, ".", key), ">= 0 (0: no limit)", absl::StrCat(value));
  };
  PRL_RETURN_IF_ERROR(quota(limits.max_prompt_sets, "max_prompt_sets"));
  PRL_RETURN_IF_ERROR(quota(limits.max_prompts_in_flight, "max_prompts_in_flight"));
  return quota(limits.max_adapters, "max_adapters");
}

}  // namespace prl::coordinator
