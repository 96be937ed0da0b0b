#include "config/run_config.h"

#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <type_traits>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "config/run_config_fields.h"
#include "core/status_macros.h"
#include "nlohmann/json.hpp"

namespace prl::config {

namespace {

using Json = nlohmann::ordered_json;
using internal::EnumField;
using internal::VisitFields;

using StringMap = std::map<std::string, std::string>;
using StringList = std::vector<std::string>;

template <typename T>
const char* TypeName() {
  if constexpr (std::is_same_v<T, StringMap>) return "an object of strings";
  if constexpr (std::is_same_v<T, StringList>) return "a list of strings";
  if constexpr (std::is_same_v<T, std::string>) return "a string";
  if constexpr (std::is_same_v<T, bool>) return "true or false";
  if constexpr (std::is_floating_point_v<T>) return "a number";
  if constexpr (std::is_unsigned_v<T>) return "a non-negative integer";
  return "an integer";
}

struct Reader {
  const Json& root;
  std::string origin;
  absl::Status status;

  // The value of section.key, or null when absent (or after an error).
  const Json* Find(const char* section, const char* key) const {
    if (!status.ok() || !root.contains(section)) return nullptr;
    const Json& s = root.at(section);
    if (!s.is_object() || !s.contains(key)) return nullptr;
    return &s.at(key);
  }

  template <typename E>
  void operator()(const char* section, const char* key, EnumField<E> field, const char*) {
    const Json* value = Find(section, key);
    if (value == nullptr) return;
    const std::string where = absl::StrCat(origin, ": ", section, ".", key);
    if (!value->is_string()) {
      status = absl::InvalidArgumentError(absl::StrCat(
          where, ": expected one of ", EnumNameList<E>(field.names), "; found ", value->dump()));
      return;
    }
    absl::StatusOr<E> parsed = ParseEnum<E>(field.names, value->get<std::string>(), where);
    if (!parsed.ok()) {
      status = parsed.status();
      return;
    }
    field.value = *parsed;
  }

  template <typename T>
  void operator()(const char* section, const char* key, T& field, const char*) {
    const Json* found = Find(section, key);
    if (found == nullptr) return;
    const Json& value = *found;
    bool ok = false;
    if constexpr (std::is_same_v<T, StringMap>) {
      ok = value.is_object();
      for (const auto& [k, v] : value.items()) ok = ok && v.is_string();
    } else if constexpr (std::is_same_v<T, StringList>) {
      ok = value.is_array();
      for (const auto& v : value) ok = ok && v.is_string();
    } else if constexpr (std::is_same_v<T, std::string>) {
      ok = value.is_string();
    } else if constexpr (std::is_same_v<T, bool>) {
      ok = value.is_boolean();
    } else if constexpr (std::is_floating_point_v<T>) {
      ok = value.is_number();
    } else if constexpr (std::is_unsigned_v<T>) {
      ok = value.is_number_unsigned();
    } else {
      ok = value.is_number_integer() &&
           value.get<int64_t>() >= static_cast<int64_t>(std::numeric_limits<T>::min()) &&
           value.get<int64_t>() <= static_cast<int64_t>(std::numeric_limits<T>::max());
    }
    if (!ok) {
      status = absl::InvalidArgumentError(absl::StrCat(
          origin, ": ", section, ".", key, ": expected ", TypeName<T>(), ", found ", value.dump()));
      return;
    }
    field = value.get<T>();
  }
};

struct Writer {
  Json& root;
  template <typename E>
  void operator()(const char* section, const char* key, EnumField<E> field, const char*) {
    root[section][key] = std::string(EnumName<E>(field.names, field.value));
  }
  template <typename T>
  void operator()(const char* section, const char* key, T& field, const char*) {
    root[section][key] = field;
  }
};

struct KeyLister {
  std::map<std::string, std::set<std::string>> keys;
  template <typename T>
  void operator()(const char* section, const char* key, T&&, const char*) {
    keys[section].insert(key);
  }
};

// Keys in file order, with help and the value as JSON.
struct Describer {
  const Json& values;
  std::vector<ConfigKey>& out;
  template <typename T>
  void operator()(const char* section, const char* key, T&&, const char* help) {
    out.push_back({absl::StrCat(section, ".", key), help, values[section][key].dump()});
  }
};

absl::Status CheckKnownKeys(const Json& root, absl::string_view origin) {
  RunConfig scratch;
  KeyLister lister;
  VisitFields(scratch, lister);
  if (!root.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(origin, ": expected a JSON object at the top level, found ", root.dump()));
  }
  std::vector<std::string> sections;
  for (const auto& [name, unused] : lister.keys) sections.push_back(name);
  sections.push_back("tenants (a list)");
  for (const auto& [section, value] : root.items()) {
    auto it = lister.keys.find(section);
    if (it == lister.keys.end()) {
      return absl::InvalidArgumentError(absl::StrCat(origin, ": unknown section '", section,
                                                     "' (known: ", absl::StrJoin(sections, ", "),
                                                     ")"));
    }
    if (!value.is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat(origin, ": ", section, ": expected an object, found ", value.dump()));
    }
    for (const auto& [key, unused] : value.items()) {
      if (!it->second.count(key)) {
        return absl::InvalidArgumentError(absl::StrCat(origin, ": unknown key '", section, ".", key,
                                                       "' (known in ", section, ": ",
                                                       absl::StrJoin(it->second, ", "), ")"));
      }
    }
  }
  return absl::OkStatus();
}

Json ToJson(const RunConfig& config) {
  RunConfig copy = config;
  copy.tenants.clear();
  Json root = Json::object();
  Writer writer{root};
  VisitFields(copy, writer);
  if (config.tenants.empty()) return root;
  Json& tenants = root["tenants"] = Json::array();
  for (const TenantSection& t : config.tenants) {  // every key, so that it reads back the same
    const Json sections = ToJson(config.ForTenant(t));
    Json& out = tenants.emplace_back(Json::object());
    out["name"] = t.name;
    for (const char* section : {"task", "env", "agent"}) out[section] = sections[section];
    out["adapter"] = {{"rank", t.adapter.rank},
                      {"alpha", t.adapter.alpha},
                      {"rslora", t.adapter.rslora},
                      {"target_modules", t.adapter.target_modules},
                      {"learning_rate", t.adapter.learning_rate}};
  }
  return root;
}

// tenants[i].adapter: AdapterSpec's settings, each of its type.
absl::Status ReadTenantAdapter(const Json& value, const std::string& where,
                               TenantSection::Adapter* a) {
  if (!value.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where,
                     ": expected an object {rank, alpha, rslora, target_modules, "
                     "learning_rate}, found ",
                     value.dump()));
  }
  for (const auto& [key, v] : value.items()) {
    const std::string field = absl::StrCat(where, ".", key);
    auto wrong = [&](const char* expected) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": expected ", expected, ", found ", v.dump()));
    };
    if (key == "rank") {
      if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > (1 << 20)) {
        return wrong("an integer >= 0 (0: learner.lora_rank)");
      }
      a->rank = v.get<int32_t>();
    } else if (key == "alpha" || key == "learning_rate") {
      if (!v.is_number()) return wrong("a number (0: the run's)");
      (key == "alpha" ? a->alpha : a->learning_rate) = v.get<double>();
    } else if (key == "rslora") {
      if (!v.is_boolean()) return wrong("true or false");
      a->rslora = v.get<bool>();
    } else if (key == "target_modules") {
      bool ok = v.is_array();
      for (const Json& m : v) ok = ok && m.is_string();
      if (!ok) return wrong("a list of strings (PEFT's module names, or all-linear)");
      a->target_modules = v.get<std::vector<std::string>>();
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ": unknown key (known: rank, alpha, rslora, target_modules, learning_rate)"));
    }
  }
  return absl::OkStatus();
}

// The file's "tenants": each one's task, env and agent read as the run's sections with its
// keys over them (so every key is checked as the run's is), and its adapter's settings.
absl::Status ReadTenants(const Json& root, const Json& tenants, const std::string& origin,
                         RunConfig* config) {
  if (!tenants.is_array()) {
    return absl::InvalidArgumentError(absl::StrCat(
        origin, ": tenants: expected a list of objects {name, task, env, agent, adapter}, found ",
        tenants.dump()));
  }
  for (size_t i = 0; i < tenants.size(); ++i) {
    const Json& t = tenants[i];
    std::string where = absl::StrCat(origin, ": tenants[", i, "]");
    if (!t.is_object() || !t.contains("name") || !t["name"].is_string()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where,
                       ": expected an object with a \"name\" (its adapter's) and any of task, env, "
                       "agent, adapter; found ",
                       t.dump()));
    }
    TenantSection tenant;
    tenant.name = t["name"].get<std::string>();
    absl::StrAppend(&where, " ('", tenant.name.substr(0, 64), "')");
    Json merged = root;
    for (const auto& [key, value] : t.items()) {
      if (key == "name") continue;
      if (key == "adapter") {
        PRL_RETURN_IF_ERROR(ReadTenantAdapter(value, where + ".adapter", &tenant.adapter));
        continue;
      }
      if (key != "task" && key != "env" && key != "agent") {
        return absl::InvalidArgumentError(absl::StrCat(
            where, ": unknown key '", key, "' (known: name, task, env, agent, adapter)"));
      }
      if (!value.is_object()) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ".", key, ": expected an object, found ", value.dump()));
      }
      if (!merged.contains(key)) merged[key] = Json::object();
      for (const auto& [k, v] : value.items()) merged[key][k] = v;
    }
    PRL_RETURN_IF_ERROR(CheckKnownKeys(merged, where));
    RunConfig scratch;
    Reader reader{merged, where, absl::OkStatus()};
    VisitFields(scratch, reader);
    PRL_RETURN_IF_ERROR(reader.status);
    tenant.task = scratch.task;
    tenant.env = scratch.env;
    tenant.agent = scratch.agent;
    config->tenants.push_back(std::move(tenant));
  }
  return absl::OkStatus();
}

// The value is parsed as JSON, except for string keys (names, paths, enumerations), where
// text that is not a JSON string is the string itself: run.name=123, learner.loss=sft.
absl::Status ApplyOverride(Json& root, const std::string& assignment) {
  const size_t eq = assignment.find('=');
  const size_t dot = assignment.find('.');
  if (eq == std::string::npos || dot == std::string::npos || dot > eq || dot == 0 ||
      dot + 1 == eq) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--set: expected section.key=value (e.g. learner.lr=0.001), found '", assignment, "'"));
  }
  const std::string section = assignment.substr(0, dot);
  const std::string key = assignment.substr(dot + 1, eq - dot - 1);
  const std::string text = assignment.substr(eq + 1);
  static const Json* defaults = new Json(ToJson(RunConfig()));
  const bool string_key = defaults->contains(section) && (*defaults)[section].contains(key) &&
                          (*defaults)[section][key].is_string();
  Json value = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (value.is_discarded() || (string_key && !value.is_string())) value = text;
  if (!root.contains(section)) root[section] = Json::object();
  if (!root[section].is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--set ", assignment, ": section '", section, "' is not an object"));
  }
  root[section][key] = value;
  return absl::OkStatus();
}

}  // namespace

std::string AtLearnerRank(absl::string_view address, int32_t rank) {
  return absl::StrReplaceAll(address, {{kLearnerRankPlaceholder, absl::StrCat(rank)}});
}

std::vector<std::pair<std::string, std::string>> LearnerRankAddresses(const RunConfig& c) {
  std::vector<std::pair<std::string, std::string>> named;
  for (const auto& [key, address] :
       {std::pair<const char*, const std::string&>("broadcast.address", c.broadcast.address),
        {"replay.address", c.replay.address}}) {
    if (absl::StrContains(address, kLearnerRankPlaceholder)) named.emplace_back(key, address);
  }
  return named;
}

absl::StatusOr<RunConfig> ParseRunConfig(absl::string_view json_text, absl::string_view origin,
                                         const std::vector<std::string>& overrides) {
  Json root = Json::parse(json_text.begin(), json_text.end(), nullptr, false);
  if (root.is_discarded()) {
    return absl::InvalidArgumentError(absl::StrCat(origin, ": not valid JSON"));
  }
  for (const std::string& assignment : overrides)
    PRL_RETURN_IF_ERROR(ApplyOverride(root, assignment));
  Json tenants;  // a list, read apart from the sections
  if (root.is_object() && root.contains("tenants")) {
    tenants = root["tenants"];
    root.erase("tenants");
  }
  PRL_RETURN_IF_ERROR(CheckKnownKeys(root, origin));
  RunConfig config;
  Reader reader{root, std::string(origin), absl::OkStatus()};
  VisitFields(config, reader);
  PRL_RETURN_IF_ERROR(reader.status);
  if (!tenants.is_null()) {
    PRL_RETURN_IF_ERROR(ReadTenants(root, tenants, std::string(origin), &config));
  }
  absl::Status valid = ValidateRunConfig(config);
  if (!valid.ok()) return absl::InvalidArgumentError(absl::StrCat(origin, ": ", valid.message()));
  return config;
}

absl::StatusOr<RunConfig> LoadRunConfig(const std::string& path,
                                        const std::vector<std::string>& overrides) {
  if (path.empty()) return ParseRunConfig("{}", "built-in defaults", overrides);
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("--config: cannot read '", path, "'"));
  std::stringstream text;
  text << in.rdbuf();
  return ParseRunConfig(text.str(), path, overrides);
}

std::string RunConfigToJson(const RunConfig& config) { return ToJson(config).dump(2); }

RunConfig RunConfig::ForTenant(const TenantSection& tenant) const {
  RunConfig c = *this;
  c.tenants.clear();
  c.task = tenant.task;
  c.env = tenant.env;
  c.agent = tenant.agent;
  return c;
}

std::vector<ConfigKey> ListConfigKeys(const RunConfig& config) {
  const Json values = ToJson(config);
  std::vector<ConfigKey> keys;
  Describer describer{values, keys};
  RunConfig copy = config;
  VisitFields(copy, describer);
  return keys;
}

}  // namespace prl::config
