#include "env/builtin_environments.h"

#include "absl/strings/str_cat.h"
#include "env/calculator.h"
#include "env/guess_number.h"

namespace prl::env {

absl::StatusOr<std::shared_ptr<Environment>> MakeBuiltinEnvironment(absl::string_view name,
                                                                    absl::string_view field) {
  if (name == "calculator") return std::make_shared<CalculatorEnvironment>();
  if (name == "guess_number") return std::make_shared<GuessNumberEnvironment>();
  return absl::InvalidArgumentError(absl::StrCat(
      field, ": expected ", DescribeBuiltinEnvironments(), ", found '", name.substr(0, 64), "'"));
}

std::map<std::string, std::shared_ptr<Environment>> AllBuiltinEnvironments() {
  std::map<std::string, std::shared_ptr<Environment>> all;
  for (std::string_view name : kBuiltinEnvironmentNames) {
    all[std::string(name)] = *MakeBuiltinEnvironment(std::string(name), "");
  }
  return all;
}

}  // namespace prl::env
