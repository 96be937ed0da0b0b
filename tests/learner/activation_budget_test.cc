// The activation budget's planner (learner/activation_budget.h): the longest sequence it admits
// is the longest whose planned pass fits, more recomputation admits longer ones, and a refusal
// names the settings.
#include "learner/activation_budget.h"

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "model/presets.h"

namespace prl::learner {
namespace {

PassPlanner Planner(ActivationCheckpointing mode) {
  PassPlanner p;
  p.config = *PresetConfig("tiny");
  p.options.activation_checkpointing = mode;
  return p;
}

TEST(ActivationBudgetTest, TheLongestAdmittedSequenceIsTheLongestWhosePassFits) {
  const int64_t budget = int64_t{1} << 20;
  for (const ActivationCheckpointing mode :
       {ActivationCheckpointing::kNone, ActivationCheckpointing::kSelective,
        ActivationCheckpointing::kFull}) {
    const PassPlanner p = Planner(mode);
    const int64_t longest = p.MaxSequenceTokens(budget);
    ASSERT_GT(longest, 2);
    ASSERT_LT(longest, p.config.max_position_embeddings) << "the budget must bind";
    EXPECT_LE(p.PassBytes(longest - 1, 1), budget);
    EXPECT_GT(p.PassBytes(longest, 1), budget);
    EXPECT_EQ(p.BudgetMbFor(longest + 1), 2) << "one token more needs the next MiB";
  }
  EXPECT_LT(Planner(ActivationCheckpointing::kNone).MaxSequenceTokens(budget),
            Planner(ActivationCheckpointing::kSelective).MaxSequenceTokens(budget));
  EXPECT_LT(Planner(ActivationCheckpointing::kSelective).MaxSequenceTokens(budget),
            Planner(ActivationCheckpointing::kFull).MaxSequenceTokens(budget));
  EXPECT_EQ(Planner(ActivationCheckpointing::kNone).MaxSequenceTokens(1), 0) << "nothing fits";
  EXPECT_EQ(Planner(ActivationCheckpointing::kNone).MaxSequenceTokens(int64_t{1} << 40), 1024)
      << "the context bounds it";
}

TEST(ActivationBudgetTest, TheRefusalNamesTheBudgetTheModeAndWhatTheOthersFit) {
  const PassPlanner p = Planner(ActivationCheckpointing::kNone);
  const int64_t budget = int64_t{1} << 20;
  const std::string why = p.DescribeLimits(budget);
  PassPlanner two = p;
  two.context_parallel = 2;
  const int64_t split = two.MaxSequenceTokens(budget);
  EXPECT_EQ(why,
            absl::StrCat("learner.activation_budget_mb = 1 with "
                         "learner.activation_checkpointing = none; selective fits ",
                         Planner(ActivationCheckpointing::kSelective).MaxSequenceTokens(budget),
                         " tokens, full fits ",
                         Planner(ActivationCheckpointing::kFull).MaxSequenceTokens(budget),
                         " tokens, learner.context_parallel = 2 fits ", split,
                         " tokens, or raise the budget"));
  EXPECT_GT(split, p.MaxSequenceTokens(budget)) << "a group of 2 holds a longer sequence";
}

}  // namespace
}  // namespace prl::learner
