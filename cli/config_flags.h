// Roles read the run's config file (--config, config/run_config.h) for every setting whose
// flag was not given: a flag on the command line wins over the file, the file over the
// built-in default. prl run passes the file plus the few per-process flags (names, ports).
#pragma once

#include <string>

#include "CLI/CLI.hpp"
#include "config/run_config.h"

namespace prl::cli {

// *target = value unless `flag` of `command` was given on the command line.
template <typename T, typename U>
void FromConfig(CLI::App* command, const char* flag, T* target, const U& value) {
  if (command->get_option(flag)->count() == 0) *target = static_cast<T>(value);
}

}  // namespace prl::cli
