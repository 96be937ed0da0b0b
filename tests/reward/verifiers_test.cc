// The built-in rewards on hand-made completions, and the reward spec's start-up errors.
#include "reward/verifiers.h"

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "tests/status_testing.h"

namespace prl::testing {
namespace {

using reward::MakeRewardFunction;
using reward::RewardFunction;
using reward::RewardInput;
using reward::RewardSpec;

std::unique_ptr<RewardFunction> Make(RewardSpec spec) {
  absl::StatusOr<std::unique_ptr<RewardFunction>> fn = MakeRewardFunction(spec);
  EXPECT_TRUE(fn.ok()) << fn.status();
  return fn.ok() ? std::move(fn).value() : nullptr;
}

RewardInput Input(std::string completion, std::string reference, uint64_t group_id = 0) {
  RewardInput in;
  in.completion = std::move(completion);
  in.reference = std::move(reference);
  in.group_id = group_id;
  return in;
}

double Score(RewardFunction& fn, std::string completion, std::string reference) {
  absl::StatusOr<double> r = fn.Score(Input(std::move(completion), std::move(reference)));
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *r : -1;
}

absl::Status ScoreError(RewardFunction& fn, std::string completion, std::string reference) {
  return fn.Score(Input(std::move(completion), std::move(reference))).status();
}

TEST(VerifiersTest, ExactMatchStripsSurroundingWhitespaceOnly) {
  auto fn = Make({"exact_match", {}});
  EXPECT_EQ(Score(*fn, " 42 \n", "42"), 1.0);
  EXPECT_EQ(Score(*fn, "42", "\t42\n"), 1.0);
  EXPECT_EQ(Score(*fn, "4 2", "42"), 0.0);
  EXPECT_EQ(Score(*fn, "42.", "42"), 0.0);
  EXPECT_EQ(Score(*fn, "Yes", "yes"), 0.0);
  EXPECT_EQ(Score(*fn, "", "42"), 0.0);
  EXPECT_TRUE(IsError(ScoreError(*fn, "42", ""), absl::StatusCode::kInvalidArgument,
                      {"exact_match", "needs a reference answer"}));
}

TEST(VerifiersTest, NumericReadsTheNumberAfterTheLastHashes) {
  auto fn = Make({"numeric", {}});
  EXPECT_EQ(Score(*fn, "6 * 12 = 72\n#### 72", "72"), 1.0);
  EXPECT_EQ(Score(*fn, "####   \n 72", "72"), 1.0);
  EXPECT_EQ(Score(*fn, "#### 72 dollars.", "72"), 1.0);
  EXPECT_EQ(Score(*fn, "#### 72.", "72"), 1.0);
  EXPECT_EQ(Score(*fn, "#### $1,234,567", "1234567"), 1.0);
  EXPECT_EQ(Score(*fn, "#### -3.50", "-3.5"), 1.0);
  EXPECT_EQ(Score(*fn, "#### .5", "0.5"), 1.0);
  EXPECT_EQ(Score(*fn, "#### 1e3", "1000"), 1.0);
  EXPECT_EQ(Score(*fn, "#### 5\nwait, no\n#### 6", "6"), 1.0);
  EXPECT_EQ(Score(*fn, "#### 5\nwait, no\n#### 6", "5"), 0.0) << "only the last one counts";
  EXPECT_EQ(Score(*fn, "#### 71", "72"), 0.0);
  EXPECT_EQ(Score(*fn, "#### 1,2", "12"), 0.0) << "',2' is no thousands group";
}

TEST(VerifiersTest, NumericReadsTheLastBoxedAnswer) {
  auto fn = Make({"numeric", {}});
  EXPECT_EQ(Score(*fn, "so $x = \\boxed{-7}$.", "-7"), 1.0);
  EXPECT_EQ(Score(*fn, "\\boxed{ 0.25 }", "0.25"), 1.0);
  EXPECT_EQ(Score(*fn, "\\boxed{3} or rather \\boxed{4}", "4"), 1.0);
  EXPECT_EQ(Score(*fn, "#### 3 then \\boxed{4}", "4"), 1.0) << "whichever comes last";
  EXPECT_EQ(Score(*fn, "\\boxed{4} then #### 3", "3"), 1.0);
  EXPECT_EQ(Score(*fn, "\\boxed{\\frac{1}{2}}", "0.5"), 0.0) << "not a plain number";
  EXPECT_EQ(Score(*fn, "\\boxed{12 apples}", "12"), 0.0);
  EXPECT_EQ(Score(*fn, "\\boxed{12", "12"), 0.0) << "cut off before the closing brace";
}

TEST(VerifiersTest, NumericWithoutAFinalAnswerScoresZero) {
  auto fn = Make({"numeric", {}});
  EXPECT_EQ(Score(*fn, "The answer is 72", "72"), 0.0);
  EXPECT_EQ(Score(*fn, "####", "72"), 0.0);
  EXPECT_EQ(Score(*fn, "#### seventy-two", "72"), 0.0);
  EXPECT_EQ(Score(*fn, "", "72"), 0.0);
}

TEST(VerifiersTest, NumericReferenceMayBeAFullSolution) {
  auto fn = Make({"numeric", {}});
  EXPECT_EQ(Score(*fn, "#### 72", "48 + 24 = 72 clips.\n#### 72"), 1.0);
  EXPECT_EQ(Score(*fn, "#### 72", "\\boxed{72}"), 1.0);
  EXPECT_EQ(Score(*fn, "#### 72", "  72\n"), 1.0);
  EXPECT_TRUE(IsError(ScoreError(*fn, "#### 72", "seventy-two"), absl::StatusCode::kInvalidArgument,
                      {"'seventy-two'", "holds no number"}));
  EXPECT_TRUE(IsError(ScoreError(*fn, "#### 72", ""), absl::StatusCode::kInvalidArgument,
                      {"numeric", "needs a reference answer"}));
}

TEST(VerifiersTest, NumericToleranceIsAbsolute) {
  auto strict = Make({"numeric", {}});
  auto loose = Make({"numeric", {{"tolerance", "0.01"}}});
  EXPECT_EQ(Score(*strict, "#### 0.333", "0.3333333"), 0.0);
  EXPECT_EQ(Score(*loose, "#### 0.333", "0.3333333"), 1.0);
  EXPECT_EQ(Score(*loose, "#### 0.32", "0.3333333"), 0.0);
  EXPECT_EQ(Score(*strict, "#### 100000000.0000001", "100000000"), 1.0);
}

TEST(VerifiersTest, RegexSearchesTheCompletion) {
  auto fn = Make({"regex", {{"pattern", "answer: (yes|no)\\b"}}});
  EXPECT_EQ(Score(*fn, "thinking...\nanswer: yes\n", ""), 1.0);
  EXPECT_EQ(Score(*fn, "answer: maybe", ""), 0.0);
  auto anchored = Make({"regex", {{"pattern", "^-?\\d+$"}}});
  EXPECT_EQ(Score(*anchored, "-123", ""), 1.0);
  EXPECT_EQ(Score(*anchored, "12a", ""), 0.0);
}

TEST(VerifiersTest, RegexMatchesLongCompletionsWithoutOverflowingTheStack) {
  // libstdc++'s backtracking matcher crashes on this at ~100k characters.
  auto format = Make({"regex", {{"pattern", "^<think>[\\s\\S]*</think>\\s*answer: \\d+$"}}});
  const std::string thoughts(1'000'000, 'x');
  EXPECT_EQ(Score(*format, absl::StrCat("<think>", thoughts, "</think>\nanswer: 4"), ""), 1.0);
  EXPECT_EQ(Score(*format, absl::StrCat("<think>", thoughts, "</think>\nanswer: ?"), ""), 0.0);
}

TEST(VerifiersTest, InvalidOrMissingRegexIsAStartUpError) {
  EXPECT_TRUE(IsError(MakeRewardFunction({"regex", {{"pattern", "(a"}}}).status(),
                      absl::StatusCode::kInvalidArgument,
                      {"reward 'regex'", "'pattern'", "ECMAScript", "found '(a'"}));
  EXPECT_TRUE(IsError(MakeRewardFunction({"regex", {}}).status(),
                      absl::StatusCode::kInvalidArgument,
                      {"reward 'regex'", "missing parameter 'pattern'"}));
  EXPECT_TRUE(IsError(MakeRewardFunction({"regex", {{"pattern", "(a)\\1"}}}).status(),
                      absl::StatusCode::kInvalidArgument, {"without back-references"}));
}

TEST(VerifiersTest, ArithmeticIsExactByDefaultAndReportsBothComponents) {
  auto exact = Make({"arithmetic", {}});
  auto digits = Make({"arithmetic", {{"credit", "digits"}}});
  EXPECT_EQ(Score(*exact, "357", "357"), 1.0);
  EXPECT_EQ(Score(*exact, " 357", "357"), 0.0);
  EXPECT_EQ(Score(*exact, "347", "357"), 0.0);
  EXPECT_DOUBLE_EQ(Score(*digits, "347", "357"), 2.0 / 3);
  const std::vector<RewardInput> batch = {Input("347", "357"), Input("-5", "-5")};
  auto results = exact->ScoreBatch(batch);
  ASSERT_TRUE(results.ok()) << results.status();
  EXPECT_EQ((*results)[0].reward, 0.0);
  EXPECT_DOUBLE_EQ((*results)[0].components.at("digits"), 2.0 / 3);
  EXPECT_EQ((*results)[0].components.at("exact"), 0.0);
  EXPECT_EQ((*results)[1].reward, 1.0);
  EXPECT_EQ((*results)[1].components.at("digits"), 1.0);
}

TEST(VerifiersTest, ABatchFailsWholeNamingTheSample) {
  auto fn = Make({"arithmetic", {}});
  const std::vector<RewardInput> batch = {Input("1", "1", 9), Input("1", "1", 9),
                                          Input("1", "", 9)};
  EXPECT_TRUE(IsError(fn->ScoreBatch(batch).status(), absl::StatusCode::kInvalidArgument,
                      {"sample 2 (group 9)", "needs a reference answer"}));
}

TEST(VerifiersTest, SpecErrorsNameTheRewardAndParameter) {
  EXPECT_TRUE(IsError(MakeRewardFunction({"exactmatch", {}}).status(),
                      absl::StatusCode::kInvalidArgument,
                      {"unknown reward 'exactmatch'", "exact_match, numeric, regex, arithmetic"}));
  EXPECT_TRUE(IsError(MakeRewardFunction({"numeric", {{"tol", "1"}}}).status(),
                      absl::StatusCode::kInvalidArgument,
                      {"reward 'numeric'", "unknown parameter 'tol'", "tolerance"}));
  EXPECT_TRUE(IsError(MakeRewardFunction({"exact_match", {{"x", "1"}}}).status(),
                      absl::StatusCode::kInvalidArgument, {"unknown parameter 'x'", "none"}));
  EXPECT_TRUE(IsError(MakeRewardFunction({"numeric", {{"tolerance", "-1"}}}).status(),
                      absl::StatusCode::kInvalidArgument,
                      {"'tolerance'", "finite number >= 0", "found '-1'"}));
  EXPECT_TRUE(IsError(MakeRewardFunction({"numeric", {{"tolerance", "abc"}}}).status(),
                      absl::StatusCode::kInvalidArgument, {"'tolerance'", "found 'abc'"}));
  EXPECT_TRUE(IsError(MakeRewardFunction({"arithmetic", {{"credit", "half"}}}).status(),
                      absl::StatusCode::kInvalidArgument,
                      {"'credit'", "'exact' or 'digits'", "found 'half'"}));
  EXPECT_TRUE(IsError(MakeRewardFunction({"remote", {}}).status(),
                      absl::StatusCode::kInvalidArgument, {"missing parameter 'address'"}));
  EXPECT_TRUE(
      IsError(MakeRewardFunction({"remote", {{"address", "h:1"}, {"attempts", "0"}}}).status(),
              absl::StatusCode::kInvalidArgument, {"'attempts'", "integer >= 1", "found '0'"}));
  EXPECT_TRUE(MakeRewardFunction({"remote", {{"address", "localhost:1"}}}).ok());
}

TEST(VerifiersTest, ExtractFinalAnswer) {
  EXPECT_EQ(reward::ExtractFinalAnswer("#### -12"), -12.0);
  EXPECT_EQ(reward::ExtractFinalAnswer("\\boxed{+3}"), 3.0);
  EXPECT_EQ(reward::ExtractFinalAnswer("no marker 5"), std::nullopt);
  EXPECT_EQ(reward::ExtractFinalAnswer("#### -"), std::nullopt);
}

}  // namespace
}  // namespace prl::testing
