// How every role and tool reads the run config (config/run_config.h): --config FILE,
// --set section.key=value (repeatable), --print-config, and shorthand flags for single keys
// (`--kv-cache-mb 64` is `--set actors.kv_cache_mb=64`; a boolean key is a flag without a
// value). The file is read first, then every --set in order, then the shorthands given; so
// `prl ROLE --config F --print-config` prints exactly what `prl run --config F --print-config`
// prints, and every default comes from the config.
#pragma once

#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/statusor.h"
#include "config/run_config.h"

namespace prl::cli {

class ConfigFlags {
 public:
  // Adds --config, --set and --print-config to `command`.
  explicit ConfigFlags(CLI::App* command);

  // Adds `flag` (e.g. "--kv-cache-mb") as a shorthand for `key` (e.g. "actors.kv_cache_mb");
  // its help is the key's help from the config, with the key and its default.
  ConfigFlags& Shorthand(const std::string& flag, const std::string& key);

  // The effective config. Extra assignments ("section.key=value") apply last (commands that
  // set keys of their own, like prl run's --mode).
  absl::StatusOr<config::RunConfig> Load(const std::vector<std::string>& extra = {}) const;

  // Loads the config and runs `action` with it; with --print-config, prints it instead.
  absl::Status Run(const std::function<absl::Status(const config::RunConfig&)>& action,
                   const std::vector<std::string>& extra = {}) const;

 private:
  struct Shorthand_ {
    std::string key;
    CLI::Option* option = nullptr;
    std::string value;     // the option's argument
    bool is_bool = false;  // a boolean key: a flag, given means true
    bool given = false;    // the flag's storage
  };
  CLI::App* command_;
  std::string file_;
  std::vector<std::string> sets_;
  bool print_ = false;
  std::deque<Shorthand_> shorthands_;  // deque: CLI11 keeps pointers to the values
};

}  // namespace prl::cli
