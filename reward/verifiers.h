// Built-in rewards, selected by name with string parameters (the run config's reward spec),
// and the factory that also builds the remote reward (reward/reward_service.h).
//
//   exact_match  1 iff the completion equals the reference after stripping ASCII whitespace
//                at both ends, else 0. No parameters.
//   numeric      1 iff the completion's final answer is within `tolerance` (absolute, >= 0,
//                default 1e-6) of the reference's, else 0. The final answer is the number
//                after the last "####" or inside the last \boxed{...}, whichever comes last
//                (ExtractFinalAnswer); a completion without one scores 0. The reference is
//                read the same way when it has "####" or \boxed{}, else it must be a number.
//   regex        1 iff the completion contains a match of `pattern` (required; ECMAScript
//                syntax without back-references, std::regex_search: anchor with ^ and $ for
//                a whole-completion match), else 0. Matching takes linear time and bounded
//                stack, however long the completion.
//   arithmetic   the built-in task's verifier (task/arithmetic_task.h): `credit` = "exact"
//                (default: 1 iff completion == reference, byte for byte) or "digits" (the
//                fraction of correct digits). Both are reported as components "exact" and
//                "digits" by ScoreBatch.
//   remote       an external RewardService: `address` (required, host:port), `timeout_ms`
//                (per batch, all attempts included, default 30000), `attempts` (default 3),
//                `backoff_ms` (first retry delay, doubled per retry, default 100).
//
// exact_match, numeric and arithmetic need a reference answer: an empty one is an
// InvalidArgument error (the prompt set lacks answers), not a reward of 0.
// Every reward here is thread-safe.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "reward/reward_function.h"

namespace prl::reward {

struct RewardSpec {
  std::string name;                           // one of RewardNames()
  std::map<std::string, std::string> params;  // parameter -> value, as written in the config
};

std::vector<std::string> RewardNames();

// Validates the spec and builds the reward: an unknown name, an unknown or missing parameter,
// an unparsable value or an invalid regex is an InvalidArgument error naming it, so that a bad
// config fails at start-up and not at the first sample.
absl::StatusOr<std::unique_ptr<RewardFunction>> MakeRewardFunction(const RewardSpec& spec);

// The final answer of a GSM8K/MATH-style solution: the number after the last "####" or inside
// the last \boxed{...} (braces may nest), whichever comes last; nullopt when that place holds
// no number. Numbers: optional sign and '$', digits with optional thousands commas ("1,234"),
// optional fraction and exponent ("-0.5", "3e2"). After "####" text may follow the number
// ("#### 72 dollars"); inside \boxed{} only whitespace may surround it.
std::optional<double> ExtractFinalAnswer(absl::string_view text);

}  // namespace prl::reward
