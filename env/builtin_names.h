// The names of prl's built-in environments, in one list (header-only, so that the run config
// and the coordinator check names without linking the environments): what a prompt set may
// name without an address, what `prl env serve` hosts, what env.name may be without
// env.address. env/builtin_environments.h makes them.
#pragma once

#include <algorithm>
#include <array>
#include <string>
#include <string_view>

namespace prl::env {

inline constexpr std::array<std::string_view, 2> kBuiltinEnvironmentNames = {"calculator",
                                                                             "guess_number"};

inline bool IsBuiltinEnvironment(std::string_view name) {
  return std::find(kBuiltinEnvironmentNames.begin(), kBuiltinEnvironmentNames.end(), name) !=
         kBuiltinEnvironmentNames.end();
}

// "calculator, guess_number", for errors.
inline std::string DescribeBuiltinEnvironments() {
  std::string out;
  for (size_t i = 0; i < kBuiltinEnvironmentNames.size(); ++i) {
    if (i > 0) out += ", ";
    out += kBuiltinEnvironmentNames[i];
  }
  return out;
}

}  // namespace prl::env
