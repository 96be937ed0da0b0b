#include "reward/verifiers.h"

#include <algorithm>
#include <cmath>
#include <regex>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/status_macros.h"
#include "reward/reward_service.h"
#include "task/arithmetic_task.h"

namespace prl::reward {

namespace {

bool IsDigit(char c) { return c >= '0' && c <= '9'; }

// Reads the parameters of one spec; CheckNoUnknown then rejects any parameter not read.
class Params {
 public:
  explicit Params(const RewardSpec& spec) : spec_(spec) {}

  const std::string* Find(const std::string& key) {
    known_.push_back(key);
    auto it = spec_.params.find(key);
    return it == spec_.params.end() ? nullptr : &it->second;
  }

  absl::StatusOr<std::string> Required(const std::string& key, absl::string_view what) {
    const std::string* value = Find(key);
    if (value == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("reward '", spec_.name, "': missing parameter '", key, "' (", what, ")"));
    }
    return *value;
  }

  absl::StatusOr<double> Double(const std::string& key, double fallback, double min) {
    const std::string* value = Find(key);
    if (value == nullptr) return fallback;
    double v = 0;
    if (!absl::SimpleAtod(*value, &v) || !std::isfinite(v) || v < min) {
      return Invalid(key, absl::StrCat("a finite number >= ", min), *value);
    }
    return v;
  }

  absl::StatusOr<int64_t> Int(const std::string& key, int64_t fallback, int64_t min) {
    const std::string* value = Find(key);
    if (value == nullptr) return fallback;
    int64_t v = 0;
    if (!absl::SimpleAtoi(*value, &v) || v < min) {
      return Invalid(key, absl::StrCat("an integer >= ", min), *value);
    }
    return v;
  }

  absl::Status Invalid(const std::string& key, absl::string_view expected,
                       absl::string_view found) const {
    return absl::InvalidArgumentError(absl::StrCat("reward '", spec_.name, "': parameter '", key,
                                                   "' must be ", expected, ", found '", found,
                                                   "'"));
  }

  absl::Status CheckNoUnknown() const {
    for (const auto& [key, value] : spec_.params) {
      if (std::find(known_.begin(), known_.end(), key) == known_.end()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "reward '", spec_.name, "': unknown parameter '", key, "' (expected ",
            known_.empty() ? "none" : absl::StrCat("one of: ", absl::StrJoin(known_, ", ")), ")"));
      }
    }
    return absl::OkStatus();
  }

 private:
  const RewardSpec& spec_;
  std::vector<std::string> known_;
};

absl::Status NeedReference(absl::string_view reward, const RewardInput& input) {
  if (!input.reference.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("reward '", reward,
                   "' needs a reference answer, found an empty one (give the prompt set's "
                   "prompts an answer, or choose a reward without one, e.g. regex)"));
}

// A number at the start of *text (after whitespace); on success *text is advanced past it.
std::optional<double> ScanNumber(absl::string_view* text) {
  const absl::string_view t = absl::StripLeadingAsciiWhitespace(*text);
  auto at = [&t](size_t j) { return j < t.size() ? t[j] : '\0'; };
  std::string digits;  // sign, digits, '.', exponent: what SimpleAtod reads
  size_t i = 0;
  if (at(i) == '$') ++i;
  if (at(i) == '-' || at(i) == '+') digits.push_back(t[i++]);
  if (at(i) == '$') ++i;
  size_t mantissa_digits = 0;
  while (true) {
    if (IsDigit(at(i))) {
      digits.push_back(t[i++]);
      ++mantissa_digits;
    } else if (at(i) == ',' && mantissa_digits > 0 && IsDigit(at(i + 1)) && IsDigit(at(i + 2)) &&
               IsDigit(at(i + 3)) && !IsDigit(at(i + 4))) {
      ++i;  // a thousands separator: exactly three digits follow
    } else {
      break;
    }
  }
  if (at(i) == '.' && IsDigit(at(i + 1))) {
    digits.push_back(t[i++]);
    while (IsDigit(at(i))) {
      digits.push_back(t[i++]);
      ++mantissa_digits;
    }
  }
  if (mantissa_digits == 0) return std::nullopt;
  if (at(i) == 'e' || at(i) == 'E') {
    size_t j = i + 1;
    if (at(j) == '-' || at(j) == '+') ++j;
    if (IsDigit(at(j))) {
      digits.append(t.data() + i, j - i);
      for (i = j; IsDigit(at(i)); ++i) digits.push_back(t[i]);
    }
  }
  double value = 0;
  if (!absl::SimpleAtod(digits, &value) || !std::isfinite(value)) return std::nullopt;
  *text = t.substr(i);
  return value;
}

// A number that is the whole of `text` but for surrounding whitespace.
std::optional<double> WholeNumber(absl::string_view text) {
  std::optional<double> value = ScanNumber(&text);
  if (!value.has_value() || !absl::StripAsciiWhitespace(text).empty()) return std::nullopt;
  return value;
}

class ExactMatch final : public RewardFunction {
 public:
  absl::StatusOr<double> Score(const RewardInput& input) override {
    PRL_RETURN_IF_ERROR(NeedReference("exact_match", input));
    return absl::StripAsciiWhitespace(input.completion) ==
                   absl::StripAsciiWhitespace(input.reference)
               ? 1.0
               : 0.0;
  }
};

class Numeric final : public RewardFunction {
 public:
  explicit Numeric(double tolerance) : tolerance_(tolerance) {}

  absl::StatusOr<double> Score(const RewardInput& input) override {
    PRL_RETURN_IF_ERROR(NeedReference("numeric", input));
    const absl::string_view ref = input.reference;
    const bool marked = ref.find("####") != ref.npos || ref.find("\\boxed{") != ref.npos;
    const std::optional<double> expected = marked ? ExtractFinalAnswer(ref) : WholeNumber(ref);
    if (!expected.has_value()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "reward 'numeric': the reference answer '", ref.substr(0, 80),
          ref.size() > 80 ? "...'" : "'",
          " holds no number (expected a number, or one after '####' or inside \\boxed{})"));
    }
    const std::optional<double> got = ExtractFinalAnswer(input.completion);
    return got.has_value() && std::abs(*got - *expected) <= tolerance_ ? 1.0 : 0.0;
  }

 private:
  double tolerance_;
};

// libstdc++'s default (backtracking) matcher recurses once per input character and overflows
// an 8 MB stack on a completion of ~100k characters. Its Thompson-NFA mode (__polynomial) runs
// in linear time with a stack bounded by the pattern, at the price of back-references.
#if defined(__GLIBCXX__)
constexpr std::regex::flag_type kRegexFlags =
    std::regex::ECMAScript | std::regex_constants::__polynomial;
#else
constexpr std::regex::flag_type kRegexFlags = std::regex::ECMAScript;
#endif

class Regex final : public RewardFunction {
 public:
  explicit Regex(std::regex regex) : regex_(std::move(regex)) {}

  absl::StatusOr<double> Score(const RewardInput& input) override {
    try {
      return std::regex_search(input.completion, regex_) ? 1.0 : 0.0;
    } catch (const std::regex_error& e) {  // error_complexity / error_stack on huge inputs
      return absl::ResourceExhaustedError(
          absl::StrCat("reward 'regex': matching a completion of ", input.completion.size(),
                       " bytes failed: ", e.what(), " (simplify the pattern)"));
    }
  }

 private:
  const std::regex regex_;  // std::regex is safe to match from several threads at once
};

class Arithmetic final : public RewardFunction {
 public:
  explicit Arithmetic(bool digit_credit) : digit_credit_(digit_credit) {}

  absl::StatusOr<double> Score(const RewardInput& input) override {
    PRL_RETURN_IF_ERROR(NeedReference("arithmetic", input));
    return digit_credit_ ? task::ArithmeticDigitCredit(input.completion, input.reference)
                         : task::ArithmeticReward(input.completion, input.reference);
  }

  absl::StatusOr<std::vector<RewardResult>> ScoreBatch(
      absl::Span<const RewardInput> inputs) override {
    PRL_ASSIGN_OR_RETURN(std::vector<RewardResult> results, RewardFunction::ScoreBatch(inputs));
    for (size_t i = 0; i < inputs.size(); ++i) {
      results[i].components["exact"] =
          task::ArithmeticReward(inputs[i].completion, inputs[i].reference);
      results[i].components["digits"] =
          task::ArithmeticDigitCredit(inputs[i].completion, inputs[i].reference);
    }
    return results;
  }

 private:
  bool digit_credit_;
};

absl::StatusOr<std::unique_ptr<RewardFunction>> MakeRegex(Params& params) {
  PRL_ASSIGN_OR_RETURN(const std::string pattern,
                       params.Required("pattern", "the ECMAScript regex a completion must match"));
  try {
    return std::make_unique<Regex>(std::regex(pattern, kRegexFlags));
  } catch (const std::regex_error& e) {
    return params.Invalid(
        "pattern",
        absl::StrCat("a valid ECMAScript regex without back-references (", e.what(), ")"), pattern);
  }
}

absl::StatusOr<std::unique_ptr<RewardFunction>> MakeRemote(Params& params) {
  RemoteRewardOptions options;
  PRL_ASSIGN_OR_RETURN(options.address,
                       params.Required("address", "host:port of the RewardService"));
  PRL_ASSIGN_OR_RETURN(const int64_t timeout_ms, params.Int("timeout_ms", 30'000, 1));
  PRL_ASSIGN_OR_RETURN(const int64_t attempts, params.Int("attempts", 3, 1));
  PRL_ASSIGN_OR_RETURN(const int64_t backoff_ms, params.Int("backoff_ms", 100, 0));
  options.timeout = absl::Milliseconds(timeout_ms);
  options.max_attempts = static_cast<int>(std::min<int64_t>(attempts, 1000));
  options.initial_backoff = absl::Milliseconds(backoff_ms);
  PRL_ASSIGN_OR_RETURN(std::unique_ptr<RemoteReward> remote, RemoteReward::Connect(options));
  return std::unique_ptr<RewardFunction>(std::move(remote));
}

}  // namespace

std::vector<std::string> RewardNames() {
  return {"exact_match", "numeric", "regex", "arithmetic", "remote"};
}

absl::StatusOr<std::unique_ptr<RewardFunction>> MakeRewardFunction(const RewardSpec& spec) {
  Params params(spec);
  std::unique_ptr<RewardFunction> reward;
  if (spec.name == "exact_match") {
    reward = std::make_unique<ExactMatch>();
  } else if (spec.name == "numeric") {
    PRL_ASSIGN_OR_RETURN(const double tolerance, params.Double("tolerance", 1e-6, 0));
    reward = std::make_unique<Numeric>(tolerance);
  } else if (spec.name == "regex") {
    PRL_ASSIGN_OR_RETURN(reward, MakeRegex(params));
  } else if (spec.name == "arithmetic") {
    const std::string* credit = params.Find("credit");
    if (credit != nullptr && *credit != "exact" && *credit != "digits") {
      return params.Invalid("credit", "'exact' or 'digits'", *credit);
    }
    reward = std::make_unique<Arithmetic>(credit != nullptr && *credit == "digits");
  } else if (spec.name == "remote") {
    PRL_ASSIGN_OR_RETURN(reward, MakeRemote(params));
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown reward '", spec.name,
                     "' (expected one of: ", absl::StrJoin(RewardNames(), ", "), ")"));
  }
  PRL_RETURN_IF_ERROR(params.CheckNoUnknown());
  return reward;
}

std::optional<double> ExtractFinalAnswer(absl::string_view text) {
  const size_t hashes = text.rfind("####");
  const size_t boxed = text.rfind("\\boxed{");
  if (hashes == text.npos && boxed == text.npos) return std::nullopt;
  if (hashes != text.npos && (boxed == text.npos || hashes > boxed)) {
    absl::string_view rest = text.substr(hashes + 4);
    return ScanNumber(&rest);
  }
  const size_t open = boxed + 7;  // after "\boxed{"
  int depth = 1;
  for (size_t i = open; i < text.size(); ++i) {
    if (text[i] == '{') ++depth;
    if (text[i] == '}' && --depth == 0) return WholeNumber(text.substr(open, i - open));
  }
  return std::nullopt;  // unbalanced: the answer was cut off
}

}  // namespace prl::reward
