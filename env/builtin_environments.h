// prl's built-in environments (their names: env/builtin_names.h), made by name: for the
// actors' episodes, `prl env serve` and the warm-start's demonstrations.
//
// Thread-safety: free functions.
#pragma once

#include <map>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "env/builtin_names.h"
#include "env/environment.h"

namespace prl::env {

// A new instance of the named one; InvalidArgument naming `field` and the list otherwise.
absl::StatusOr<std::shared_ptr<Environment>> MakeBuiltinEnvironment(absl::string_view name,
                                                                    absl::string_view field);
// One instance of each, by name.
std::map<std::string, std::shared_ptr<Environment>> AllBuiltinEnvironments();

}  // namespace prl::env
