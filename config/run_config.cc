#include "config/run_config.h"

#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/status_macros.h"
#include "nlohmann/json.hpp"

namespace prl::config {

namespace {

using Json = nlohmann::ordered_json;

// Every field once, as (section, key, member): the reader, the writer and the list of known
// keys all walk this, so they cannot disagree.
template <typename Visitor>
void VisitFields(RunConfig& c, Visitor& v) {
  v("run", "name", c.run.name);
  v("run", "dir", c.run.dir);
  v("run", "mode", c.run.mode);
  v("run", "seed", c.run.seed);
  v("model", "path", c.model.path);
  v("model", "preset", c.model.preset);
  v("model", "max_position_embeddings", c.model.max_position_embeddings);
  v("model", "init_seed", c.model.init_seed);
  v("task", "name", c.task.name);
  v("task", "min_digits", c.task.min_digits);
  v("task", "max_digits", c.task.max_digits);
  v("task", "operations", c.task.operations);
  v("task", "eval_prompts", c.task.eval_prompts);
  v("task", "samples_per_prompt", c.task.samples_per_prompt);
  v("task", "max_tokens", c.task.max_tokens);
  v("task", "temperature", c.task.temperature);
  v("task", "top_p", c.task.top_p);
  v("task", "reward", c.task.reward);
  v("task", "credit", c.task.credit);
  v("sft", "steps", c.sft.steps);
  v("sft", "lr", c.sft.lr);
  v("sft", "examples_per_step", c.sft.examples_per_step);
  v("actors", "count", c.actors.count);
  v("actors", "max_prompts_in_flight", c.actors.max_prompts_in_flight);
  v("actors", "max_num_seqs", c.actors.max_num_seqs);
  v("actors", "kv_cache_mb", c.actors.kv_cache_mb);
  v("actors", "max_restarts", c.actors.max_restarts);
  v("learner", "world_size", c.learner.world_size);
  v("learner", "steps", c.learner.steps);
  v("learner", "groups_per_step", c.learner.groups_per_step);
  v("learner", "loss", c.learner.loss);
  v("learner", "optimizer", c.learner.optimizer);
  v("learner", "advantage", c.learner.advantage);
  v("learner", "lr", c.learner.lr);
  v("learner", "max_grad_norm", c.learner.max_grad_norm);
  v("learner", "max_lag", c.learner.max_lag);
  v("learner", "checkpoint_every", c.learner.checkpoint_every);
  v("learner", "micro_batch_tokens", c.learner.micro_batch_tokens);
  v("learner", "max_restarts", c.learner.max_restarts);
  v("replay", "capacity_mb", c.replay.capacity_mb);
  v("broadcast", "transport", c.broadcast.transport);
  v("coordinator", "address", c.coordinator.address);
  v("coordinator", "lease_ms", c.coordinator.lease_ms);
  v("coordinator", "heartbeat_ms", c.coordinator.heartbeat_ms);
  v("coordinator", "max_pending_prompts", c.coordinator.max_pending_prompts);
  v("metrics", "enabled", c.metrics.enabled);
  v("metrics", "base_port", c.metrics.base_port);
}

template <typename T>
const char* TypeName() {
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

  template <typename T>
  void operator()(const char* section, const char* key, T& field) {
    if (!status.ok() || !root.contains(section)) return;
    const Json& s = root.at(section);
    if (!s.is_object() || !s.contains(key)) return;
    const Json& value = s.at(key);
    bool ok = false;
    if constexpr (std::is_same_v<T, std::string>) {
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
  template <typename T>
  void operator()(const char* section, const char* key, T& field) {
    root[section][key] = field;
  }
};

struct KeyLister {
  std::map<std::string, std::set<std::string>> keys;
  template <typename T>
  void operator()(const char* section, const char* key, T&) {
    keys[section].insert(key);
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
  Json value = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (value.is_discarded()) value = text;  // a bare string: mode=sync
  if (!root.contains(section)) root[section] = Json::object();
  if (!root[section].is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--set ", assignment, ": section '", section, "' is not an object"));
  }
  root[section][key] = value;
  return absl::OkStatus();
}

template <typename T>
absl::Status Range(bool ok, const char* field, const char* expected, const T& found) {
  if (ok) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(field, ": expected ", expected, ", found ", found));
}

}  // namespace

absl::Status ValidateRunConfig(const RunConfig& c) {
  PRL_RETURN_IF_ERROR(Range(!c.run.name.empty() && c.run.name.find('/') == std::string::npos,
                            "run.name", "a non-empty name without '/'", "'" + c.run.name + "'"));
  PRL_RETURN_IF_ERROR(Range(c.run.mode == "pipeline" || c.run.mode == "sync", "run.mode",
                            "pipeline or sync", "'" + c.run.mode + "'"));
  PRL_RETURN_IF_ERROR(Range(!c.model.path.empty() || !c.model.preset.empty(), "model.preset",
                            "a preset name when model.path is empty", "''"));
  PRL_RETURN_IF_ERROR(Range(c.model.max_position_embeddings >= 8, "model.max_position_embeddings",
                            ">= 8", c.model.max_position_embeddings));
  PRL_RETURN_IF_ERROR(Range(c.task.name == "arithmetic", "task.name",
                            "arithmetic (the built-in task)", "'" + c.task.name + "'"));
  PRL_RETURN_IF_ERROR(Range(c.task.eval_prompts >= 1 && c.task.eval_prompts <= 100000,
                            "task.eval_prompts", "1 to 100000", c.task.eval_prompts));
  PRL_RETURN_IF_ERROR(Range(c.task.samples_per_prompt >= 2 && c.task.samples_per_prompt <= 1024,
                            "task.samples_per_prompt",
                            "2 to 1024 (group-normalised advantages need two samples)",
                            c.task.samples_per_prompt));
  PRL_RETURN_IF_ERROR(Range(c.task.max_tokens >= 1, "task.max_tokens", ">= 1", c.task.max_tokens));
  PRL_RETURN_IF_ERROR(Range(c.task.temperature > 0 && c.task.temperature <= 10, "task.temperature",
                            "a number in (0, 10]", c.task.temperature));
  PRL_RETURN_IF_ERROR(Range(c.task.top_p > 0 && c.task.top_p <= 1, "task.top_p",
                            "a number in (0, 1]", c.task.top_p));
  PRL_RETURN_IF_ERROR(Range(c.task.credit == "exact" || c.task.credit == "digits", "task.credit",
                            "exact or digits", "'" + c.task.credit + "'"));
  PRL_RETURN_IF_ERROR(Range(c.sft.steps >= 0, "sft.steps", ">= 0", c.sft.steps));
  PRL_RETURN_IF_ERROR(Range(c.sft.lr > 0, "sft.lr", "a number > 0", c.sft.lr));
  PRL_RETURN_IF_ERROR(Range(c.sft.examples_per_step >= 1, "sft.examples_per_step", ">= 1",
                            c.sft.examples_per_step));
  PRL_RETURN_IF_ERROR(Range(c.actors.count >= 1 && c.actors.count <= 64, "actors.count", "1 to 64",
                            c.actors.count));
  PRL_RETURN_IF_ERROR(Range(c.actors.max_prompts_in_flight >= 1, "actors.max_prompts_in_flight",
                            ">= 1", c.actors.max_prompts_in_flight));
  PRL_RETURN_IF_ERROR(
      Range(c.actors.max_num_seqs >= 1, "actors.max_num_seqs", ">= 1", c.actors.max_num_seqs));
  PRL_RETURN_IF_ERROR(
      Range(c.actors.kv_cache_mb >= 1, "actors.kv_cache_mb", ">= 1", c.actors.kv_cache_mb));
  PRL_RETURN_IF_ERROR(
      Range(c.actors.max_restarts >= 0, "actors.max_restarts", ">= 0", c.actors.max_restarts));
  PRL_RETURN_IF_ERROR(Range(c.learner.world_size >= 1 && c.learner.world_size <= 64,
                            "learner.world_size", "1 to 64", c.learner.world_size));
  PRL_RETURN_IF_ERROR(Range(c.learner.steps >= 1, "learner.steps", ">= 1", c.learner.steps));
  PRL_RETURN_IF_ERROR(Range(c.learner.groups_per_step >= 1, "learner.groups_per_step", ">= 1",
                            c.learner.groups_per_step));
  PRL_RETURN_IF_ERROR(Range(c.learner.lr > 0, "learner.lr", "a number > 0", c.learner.lr));
  PRL_RETURN_IF_ERROR(Range(c.learner.max_grad_norm >= 0, "learner.max_grad_norm", ">= 0",
                            c.learner.max_grad_norm));
  PRL_RETURN_IF_ERROR(Range(c.learner.max_lag >= 0, "learner.max_lag", ">= 0", c.learner.max_lag));
  PRL_RETURN_IF_ERROR(Range(c.learner.checkpoint_every >= 1, "learner.checkpoint_every", ">= 1",
                            c.learner.checkpoint_every));
  PRL_RETURN_IF_ERROR(Range(c.learner.micro_batch_tokens >= 16, "learner.micro_batch_tokens",
                            ">= 16", c.learner.micro_batch_tokens));
  PRL_RETURN_IF_ERROR(
      Range(c.learner.max_restarts >= 0, "learner.max_restarts", ">= 0", c.learner.max_restarts));
  PRL_RETURN_IF_ERROR(Range(c.learner.advantage == "grpo" || c.learner.advantage == "dr_grpo",
                            "learner.advantage", "grpo or dr_grpo",
                            "'" + c.learner.advantage + "'"));
  PRL_RETURN_IF_ERROR(
      Range(c.replay.capacity_mb >= 1, "replay.capacity_mb", ">= 1", c.replay.capacity_mb));
  PRL_RETURN_IF_ERROR(Range(c.broadcast.transport == "shm" || c.broadcast.transport == "grpc",
                            "broadcast.transport", "shm or grpc",
                            "'" + c.broadcast.transport + "'"));
  PRL_RETURN_IF_ERROR(Range(c.coordinator.lease_ms >= 100, "coordinator.lease_ms", ">= 100",
                            c.coordinator.lease_ms));
  PRL_RETURN_IF_ERROR(
      Range(c.coordinator.heartbeat_ms >= 10 && c.coordinator.heartbeat_ms < c.coordinator.lease_ms,
            "coordinator.heartbeat_ms", ">= 10 and below coordinator.lease_ms",
            c.coordinator.heartbeat_ms));
  PRL_RETURN_IF_ERROR(Range(c.coordinator.max_pending_prompts >= 1,
                            "coordinator.max_pending_prompts", ">= 1",
                            c.coordinator.max_pending_prompts));
  PRL_RETURN_IF_ERROR(Range(c.metrics.base_port >= 0 && c.metrics.base_port < 65000,
                            "metrics.base_port", "0 (free ports) or a port below 65000",
                            c.metrics.base_port));
  return absl::OkStatus();
}

absl::StatusOr<RunConfig> ParseRunConfig(absl::string_view json_text, absl::string_view origin,
                                         const std::vector<std::string>& overrides) {
  Json root = Json::parse(json_text.begin(), json_text.end(), nullptr, false);
  if (root.is_discarded()) {
    return absl::InvalidArgumentError(absl::StrCat(origin, ": not valid JSON"));
  }
  for (const std::string& assignment : overrides)
    PRL_RETURN_IF_ERROR(ApplyOverride(root, assignment));
  PRL_RETURN_IF_ERROR(CheckKnownKeys(root, origin));
  RunConfig config;
  Reader reader{root, std::string(origin), absl::OkStatus()};
  VisitFields(config, reader);
  PRL_RETURN_IF_ERROR(reader.status);
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

std::string RunConfigToJson(const RunConfig& config) {
  RunConfig copy = config;
  Json root = Json::object();
  Writer writer{root};
  VisitFields(copy, writer);
  return root.dump(2);
}

}  // namespace prl::config
