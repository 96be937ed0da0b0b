// The built-in arithmetic task: problems are a pure function of the seed, their answers are
// right (checked by parsing the prompt and computing independently), the train and held-out
// splits never share a problem, and the verifier scores as documented.
#include "task/arithmetic_task.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <string>

#include "tests/status_testing.h"

namespace prl::testing {
namespace {

using task::ArithmeticConfig;
using task::ArithmeticProblem;
using task::GenerateProblems;
using task::Split;

struct Parsed {
  int64_t a, b;
  char op;
};

Parsed Parse(const std::string& prompt) {
  size_t pos = 0;
  const int64_t a = std::stoll(prompt, &pos);
  const char op = prompt[pos];
  size_t pos_b = 0;
  const int64_t b = std::stoll(prompt.substr(pos + 1), &pos_b);
  EXPECT_EQ(prompt.substr(pos + 1 + pos_b), "=") << prompt;
  return {a, b, op};
}

int Digits(int64_t v) { return static_cast<int>(std::to_string(v).size()); }

// "3+45=" and "45+3=" are one problem.
std::string Canonical(const std::string& prompt) {
  const Parsed p = Parse(prompt);
  if (p.op == '-') return prompt;
  return std::to_string(std::min(p.a, p.b)) + p.op + std::to_string(std::max(p.a, p.b));
}

TEST(ArithmeticTaskTest, ProblemsAreAPureFunctionOfTheSeedAndPrefixStable) {
  const ArithmeticConfig config;
  const auto a = GenerateProblems(config, Split::kTrain, 7, 200);
  const auto b = GenerateProblems(config, Split::kTrain, 7, 200);
  const auto prefix = GenerateProblems(config, Split::kTrain, 7, 50);
  const auto other = GenerateProblems(config, Split::kTrain, 8, 200);
  ASSERT_TRUE(a.ok() && b.ok() && prefix.ok() && other.ok());
  ASSERT_EQ(a->size(), 200u);
  int differ = 0;
  for (size_t i = 0; i < a->size(); ++i) {
    EXPECT_EQ((*a)[i].prompt, (*b)[i].prompt);
    EXPECT_EQ((*a)[i].answer, (*b)[i].answer);
    if (i < prefix->size()) {
      EXPECT_EQ((*a)[i].prompt, (*prefix)[i].prompt);
    }
    differ += (*a)[i].prompt != (*other)[i].prompt;
  }
  EXPECT_GT(differ, 150) << "another seed gives other problems";
}

TEST(ArithmeticTaskTest, AnswersAreCorrectAndOperandsWithinTheDigitRange) {
  ArithmeticConfig config;
  config.min_digits = 2;
  config.max_digits = 9;
  config.operations = "+-*";
  for (Split split : {Split::kTrain, Split::kHeldOut}) {
    const auto problems = GenerateProblems(config, split, 3, 3000);
    ASSERT_TRUE(problems.ok()) << problems.status();
    std::set<char> ops;
    std::set<int> digits;
    for (const ArithmeticProblem& p : *problems) {
      const Parsed q = Parse(p.prompt);
      ops.insert(q.op);
      digits.insert(Digits(q.a));
      digits.insert(Digits(q.b));
      const int64_t expected = q.op == '+' ? q.a + q.b : q.op == '-' ? q.a - q.b : q.a * q.b;
      EXPECT_EQ(p.answer, std::to_string(expected)) << p.prompt;
    }
    EXPECT_EQ(ops, (std::set<char>{'+', '-', '*'}));
    EXPECT_EQ(digits, (std::set<int>{2, 3, 4, 5, 6, 7, 8, 9}));
  }
}

TEST(ArithmeticTaskTest, DefaultsMixOneToThreeDigitAdditions) {
  const auto problems = GenerateProblems(ArithmeticConfig(), Split::kTrain, 1, 3000);
  ASSERT_TRUE(problems.ok());
  int count[4] = {0, 0, 0, 0};
  for (const ArithmeticProblem& p : *problems) {
    const Parsed q = Parse(p.prompt);
    EXPECT_EQ(q.op, '+');
    ASSERT_LE(Digits(q.a), 3);
    ++count[Digits(q.a)];
  }
  for (int d = 1; d <= 3; ++d) EXPECT_NEAR(count[d], 1000, 150) << d << " digits";
}

TEST(ArithmeticTaskTest, TrainAndHeldOutNeverShareAProblem) {
  ArithmeticConfig config;
  config.max_digits = 2;  // a small space, so that both splits cover most of it
  config.operations = "+-*";
  const auto train = GenerateProblems(config, Split::kTrain, 11, 20000);
  const auto held_out = GenerateProblems(config, Split::kHeldOut, 12, 2000);
  ASSERT_TRUE(train.ok() && held_out.ok());
  std::set<std::string> train_set;
  for (const ArithmeticProblem& p : *train) train_set.insert(Canonical(p.prompt));
  for (const ArithmeticProblem& p : *held_out) {
    EXPECT_EQ(train_set.count(Canonical(p.prompt)), 0u) << p.prompt << " is in both splits";
    EXPECT_TRUE(task::IsHeldOut(p.prompt, config.held_out_fraction));
  }
  // Over the whole space of 2-digit subtractions, the held-out share is the requested one.
  int held = 0;
  for (int a = 0; a < 100; ++a) {
    for (int b = 0; b < 100; ++b) {
      held += task::IsHeldOut(std::to_string(a) + "-" + std::to_string(b) + "=", 0.1);
    }
  }
  EXPECT_NEAR(held / 10000.0, 0.1, 0.01);
  // The held-out split does not depend on the config: commuted prompts agree.
  EXPECT_EQ(task::IsHeldOut("3+45=", 0.5), task::IsHeldOut("45+3=", 0.5));
  EXPECT_EQ(task::IsHeldOut("3*45=", 0.5), task::IsHeldOut("45*3=", 0.5));
}

TEST(ArithmeticTaskTest, AnEmptySplitIsAnErrorNotAnEndlessLoop) {
  ArithmeticConfig config;
  config.min_digits = config.max_digits = 1;
  config.held_out_fraction = 1e-12;  // no 1-digit addition hashes this low
  const auto problems = GenerateProblems(config, Split::kHeldOut, 1, 5);
  EXPECT_TRUE(IsError(problems.status(), absl::StatusCode::kFailedPrecondition,
                      {"0 of 5 held-out problems", "digit range [1, 1]"}));
}

TEST(ArithmeticTaskTest, InvalidConfigErrorsNameTheField) {
  ArithmeticConfig c;
  c.min_digits = 0;
  EXPECT_TRUE(IsError(ValidateArithmeticConfig(c), absl::StatusCode::kInvalidArgument,
                      {"min_digits", "found 0"}));
  c = ArithmeticConfig();
  c.max_digits = 10;
  EXPECT_TRUE(IsError(ValidateArithmeticConfig(c), absl::StatusCode::kInvalidArgument,
                      {"max_digits", "found 10"}));
  c = ArithmeticConfig();
  c.operations = "+/";
  EXPECT_TRUE(IsError(ValidateArithmeticConfig(c), absl::StatusCode::kInvalidArgument,
                      {"operations", "\"+/\"", "character 1"}));
  c.operations = "++";
  EXPECT_TRUE(IsError(ValidateArithmeticConfig(c), absl::StatusCode::kInvalidArgument,
                      {"operations", "distinct"}));
  c = ArithmeticConfig();
  c.held_out_fraction = 1;
  EXPECT_TRUE(IsError(ValidateArithmeticConfig(c), absl::StatusCode::kInvalidArgument,
                      {"held_out_fraction", "found 1"}));
  EXPECT_TRUE(IsError(GenerateProblems(ArithmeticConfig(), Split::kTrain, 0, -1).status(),
                      absl::StatusCode::kInvalidArgument, {"n must be >= 0", "-1"}));
}

TEST(ArithmeticTaskTest, SftExampleIsBosPromptThenAnswerEos) {
  const task::CharTokenizer tok;
  const ArithmeticProblem p{"12+345=", "357"};
  const auto example = task::SftExample(tok, p);
  ASSERT_TRUE(example.ok());
  EXPECT_EQ(example->prompt, (std::vector<int32_t>{1, 4, 5, 13, 6, 7, 8, 16}));
  EXPECT_EQ(example->completion, (std::vector<int32_t>{6, 8, 10, 2}));
  EXPECT_EQ(*task::PromptTokens(tok, p), example->prompt);
  EXPECT_EQ(*tok.Decode(example->completion), "357");
}

TEST(ArithmeticTaskTest, ExactVerifierComparesByteForByte) {
  EXPECT_EQ(task::ArithmeticReward("357", "357"), 1.0);
  EXPECT_EQ(task::ArithmeticReward("357 ", "357"), 0.0);
  EXPECT_EQ(task::ArithmeticReward("0357", "357"), 0.0);
  EXPECT_EQ(task::ArithmeticReward("", "357"), 0.0);
  EXPECT_EQ(task::ArithmeticReward("-333", "-333"), 1.0);
}

TEST(ArithmeticTaskTest, DigitCreditIsRightAlignedOverTheLongerLength) {
  EXPECT_EQ(task::ArithmeticDigitCredit("357", "357"), 1.0);
  EXPECT_DOUBLE_EQ(task::ArithmeticDigitCredit("347", "357"), 2.0 / 3);
  EXPECT_DOUBLE_EQ(task::ArithmeticDigitCredit("57", "357"), 2.0 / 3);    // a digit missing
  EXPECT_DOUBLE_EQ(task::ArithmeticDigitCredit("1357", "357"), 3.0 / 4);  // one too many
  EXPECT_DOUBLE_EQ(task::ArithmeticDigitCredit("333", "-333"), 3.0 / 4);  // the sign missing
  EXPECT_EQ(task::ArithmeticDigitCredit("", "357"), 0.0);
  EXPECT_EQ(task::ArithmeticDigitCredit("999", "111"), 0.0);
}

}  // namespace
}  // namespace prl::testing
