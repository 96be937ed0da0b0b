#include "task/arithmetic_task.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "core/philox.h"
#include "core/status_macros.h"

namespace prl::task {

namespace {

constexpr char kAllOperations[] = "+-*";
constexpr int kMaxDigits = 9;  // 999'999'999^2 < 2^63

// Independent random streams of one candidate problem (PhiloxUniform's `stream`).
enum Stream : uint64_t { kOperation, kDigitsA, kValueA, kDigitsB, kValueB };

int64_t Pow10(int e) {
  int64_t p = 1;
  for (int i = 0; i < e; ++i) p *= 10;
  return p;
}

// Uniform integer in [lo, hi] from u in [0, 1).
int64_t UniformInt(double u, int64_t lo, int64_t hi) {
  const int64_t v = lo + static_cast<int64_t>(u * static_cast<double>(hi - lo + 1));
  return std::min(v, hi);
}

// An operand: the digit count uniform in [min, max], then uniform among the numbers with
// exactly that many digits (0 counts as a 1-digit number).
int64_t DrawOperand(const ArithmeticConfig& config, uint64_t seed, uint64_t index,
                    Stream digits_stream, Stream value_stream) {
  const int digits = static_cast<int>(
      UniformInt(PhiloxUniform(seed, digits_stream, index), config.min_digits, config.max_digits));
  const int64_t lo = digits == 1 ? 0 : Pow10(digits - 1);
  return UniformInt(PhiloxUniform(seed, value_stream, index), lo, Pow10(digits) - 1);
}

// Numbers without leading zeros compare by length, then lexicographically.
bool NumberLess(absl::string_view a, absl::string_view b) {
  return a.size() != b.size() ? a.size() < b.size() : a < b;
}

// FNV-1a, then the splitmix64 finaliser: a fixed hash (std::hash may change across releases,
// and the split must not).
uint64_t StableHash(absl::string_view text) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : text) h = (h ^ c) * 0x100000001b3ull;
  h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ull;
  h = (h ^ (h >> 27)) * 0x94d049bb133111ebull;
  return h ^ (h >> 31);
}

// "45+3=" -> "3+45=" for the commutative operations; other text is returned unchanged.
std::string CanonicalPrompt(absl::string_view prompt) {
  const size_t op = prompt.find_first_of(kAllOperations, 1);
  if (op == absl::string_view::npos || prompt.empty() || prompt.back() != '=') {
    return std::string(prompt);
  }
  absl::string_view a = prompt.substr(0, op);
  absl::string_view b = prompt.substr(op + 1, prompt.size() - op - 2);
  if (prompt[op] != '-' && NumberLess(b, a)) std::swap(a, b);
  return absl::StrCat(a, prompt.substr(op, 1), b, "=");
}

}  // namespace

absl::Status ValidateArithmeticConfig(const ArithmeticConfig& config) {
  if (config.min_digits < 1 || config.min_digits > kMaxDigits) {
    return absl::InvalidArgumentError(absl::StrCat("arithmetic task: min_digits must be in [1, ",
                                                   kMaxDigits, "], found ", config.min_digits));
  }
  if (config.max_digits < config.min_digits || config.max_digits > kMaxDigits) {
    return absl::InvalidArgumentError(
        absl::StrCat("arithmetic task: max_digits must be in [min_digits = ", config.min_digits,
                     ", ", kMaxDigits, "], found ", config.max_digits));
  }
  if (config.operations.empty()) {
    return absl::InvalidArgumentError(
        "arithmetic task: operations must hold at least one of \"+-*\", found \"\"");
  }
  for (size_t i = 0; i < config.operations.size(); ++i) {
    const char c = config.operations[i];
    if (absl::string_view(kAllOperations).find(c) == absl::string_view::npos ||
        config.operations.find(c) != i) {
      return absl::InvalidArgumentError(absl::StrCat(
          "arithmetic task: operations must be distinct characters of \"+-*\", found \"",
          config.operations, "\" (character ", i, ")"));
    }
  }
  if (!(config.held_out_fraction > 0 && config.held_out_fraction < 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("arithmetic task: held_out_fraction must be in (0, 1) so that both splits "
                     "are non-empty, found ",
                     config.held_out_fraction));
  }
  return absl::OkStatus();
}

bool IsHeldOut(absl::string_view prompt, double held_out_fraction) {
  const uint64_t h = StableHash(CanonicalPrompt(prompt));
  return static_cast<double>(h >> 11) * 0x1.0p-53 < held_out_fraction;
}

absl::StatusOr<std::vector<ArithmeticProblem>> GenerateProblems(const ArithmeticConfig& config,
                                                                Split split, uint64_t seed,
                                                                int64_t n) {
  PRL_RETURN_IF_ERROR(ValidateArithmeticConfig(config));
  if (n < 0) {
    return absl::InvalidArgumentError(absl::StrCat("GenerateProblems: n must be >= 0, found ", n));
  }
  // Each split holds a fraction of the problem space (> 0 by validation), but a very small
  // space can miss one split entirely: bound the search rather than loop forever.
  const int64_t max_candidates = 1000 * n + 100'000;
  std::vector<ArithmeticProblem> problems;
  problems.reserve(n);
  for (int64_t k = 0; static_cast<int64_t>(problems.size()) < n; ++k) {
    if (k == max_candidates) {
      return absl::FailedPreconditionError(absl::StrCat(
          "arithmetic task: found only ", problems.size(), " of ", n, " ",
          split == Split::kTrain ? "train" : "held-out", " problems in ", max_candidates,
          " draws; widen the digit range [", config.min_digits, ", ", config.max_digits,
          "] or move held_out_fraction (", config.held_out_fraction, ") away from 0 or 1"));
    }
    const uint64_t index = static_cast<uint64_t>(k);
    const char op = config.operations[UniformInt(PhiloxUniform(seed, kOperation, index), 0,
                                                 config.operations.size() - 1)];
    const int64_t a = DrawOperand(config, seed, index, kDigitsA, kValueA);
    const int64_t b = DrawOperand(config, seed, index, kDigitsB, kValueB);
    ArithmeticProblem p;
    p.prompt = absl::StrCat(a, std::string(1, op), b, "=");
    if (IsHeldOut(p.prompt, config.held_out_fraction) != (split == Split::kHeldOut)) continue;
    p.answer = absl::StrCat(op == '+' ? a + b : op == '-' ? a - b : a * b);
    problems.push_back(std::move(p));
  }
  return problems;
}

absl::StatusOr<std::vector<int32_t>> PromptTokens(const CharTokenizer& tokenizer,
                                                  const ArithmeticProblem& problem) {
  std::vector<int32_t> ids = {tokenizer.bos_id()};
  PRL_ASSIGN_OR_RETURN(const std::vector<int32_t> chars, tokenizer.Encode(problem.prompt));
  ids.insert(ids.end(), chars.begin(), chars.end());
  return ids;
}

absl::StatusOr<TokenizedExample> SftExample(const CharTokenizer& tokenizer,
                                            const ArithmeticProblem& problem) {
  TokenizedExample example;
  PRL_ASSIGN_OR_RETURN(example.prompt, PromptTokens(tokenizer, problem));
  PRL_ASSIGN_OR_RETURN(example.completion, tokenizer.Encode(problem.answer));
  example.completion.push_back(tokenizer.eos_id());
  return example;
}

double ArithmeticReward(absl::string_view completion, absl::string_view answer) {
  return completion == answer ? 1.0 : 0.0;
}

double ArithmeticDigitCredit(absl::string_view completion, absl::string_view answer) {
  const size_t longer = std::max(completion.size(), answer.size());
  const size_t shorter = std::min(completion.size(), answer.size());
  if (shorter == 0) return 0.0;
  size_t matches = 0;
  for (size_t k = 1; k <= shorter; ++k) {
    matches += completion[completion.size() - k] == answer[answer.size() - k];
  }
  return static_cast<double>(matches) / static_cast<double>(longer);
}

}  // namespace prl::task
