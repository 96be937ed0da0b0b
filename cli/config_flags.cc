#include "cli/config_flags.h"

#include <sys/stat.h>

#include <cstdio>
#include <map>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"

namespace prl::cli {

namespace {

const config::ConfigKey& DescribeKey(const std::string& key) {
  static const auto* keys = [] {
    auto* m = new std::map<std::string, config::ConfigKey>();
    for (config::ConfigKey& k : config::ListConfigKeys()) m->emplace(k.key, std::move(k));
    return m;
  }();
  auto it = keys->find(key);
  if (it == keys->end()) {
    // A shorthand for a key the config does not have is a programming error in this binary.
    std::fprintf(stderr, "prl: internal error: no config key '%s'\n", key.c_str());
    std::abort();
  }
  return it->second;
}

}  // namespace

ConfigFlags::ConfigFlags(CLI::App* command) : command_(command) {
  command->add_option("--config", file_,
                      "The run's config file (JSON; every key in docs/configuration.md)");
  command->add_option("--set", sets_, "Set one config key: section.key=value (repeatable)");
  command->add_flag("--print-config", print_, "Print the effective config and exit");
}

ConfigFlags& ConfigFlags::Shorthand(const std::string& flag, const std::string& key) {
  const config::ConfigKey& k = DescribeKey(key);
  Shorthand_& s = shorthands_.emplace_back();
  s.key = key;
  s.is_bool = k.value_json == "true" || k.value_json == "false";
  const std::string help = absl::StrCat(k.help, " (= ", key, ", default ", k.value_json, ")");
  if (s.is_bool) {
    s.option = command_->add_flag(flag, s.given, help);
  } else {
    s.option = command_->add_option(flag, s.value, help);
  }
  return *this;
}

absl::StatusOr<config::RunConfig> ConfigFlags::Load(const std::vector<std::string>& extra) const {
  std::vector<std::string> overrides = sets_;
  for (const Shorthand_& s : shorthands_) {
    if (s.option->count() == 0) continue;
    // A value that is not valid JSON is taken as a string by the config (mode=sync).
    overrides.push_back(absl::StrCat(s.key, "=", s.is_bool ? "true" : s.value));
  }
  overrides.insert(overrides.end(), extra.begin(), extra.end());
  return config::LoadRunConfig(file_, overrides);
}

absl::Status ConfigFlags::Run(const std::function<absl::Status(const config::RunConfig&)>& action,
                              const std::vector<std::string>& extra) const {
  PRL_ASSIGN_OR_RETURN(const config::RunConfig config, Load(extra));
  umask(static_cast<mode_t>(config::ParseUmask(config.run.umask)));  // validated by Load
  if (print_) {
    std::printf("%s\n", config::RunConfigToJson(config).c_str());
    return absl::OkStatus();
  }
  return action(config);
}

}  // namespace prl::cli
