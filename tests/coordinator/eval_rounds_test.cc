// EvalRounds (coordinator/eval_rounds.h): an evaluation set's schedule and each round's mean
// reward and pass@k, as a part on its own.
#include "coordinator/eval_rounds.h"

#include <gtest/gtest.h>

namespace prl::coordinator {
namespace {

prl::v1::GroupResult Group(std::initializer_list<double> rewards, int64_t min_version = 0,
                           int64_t max_version = 0) {
  prl::v1::GroupResult g;
  g.set_min_version(min_version);
  g.set_max_version(max_version);
  for (double r : rewards) g.add_rewards(r);
  return g;
}

TEST(EvalRoundsTest, ARoundIsDueAtItsVersionPlusEveryVersionsOnceTheLastOneFinished) {
  EvalRounds rounds;
  prl::v1::EvalSpec spec;
  spec.set_every_versions(5);
  rounds.Add("e", spec, 2);
  EXPECT_EQ(rounds.Due(0), std::vector<std::string>{"e"});  // submitted: due at once
  rounds.Open("e", 3);
  EXPECT_TRUE(rounds.Due(100).empty());  // one round at a time
  rounds.Finish("e", 1);
  EXPECT_TRUE(rounds.Due(7).empty());
  EXPECT_EQ(rounds.Due(8), std::vector<std::string>{"e"});
  rounds.Open("e", 20);  // a slow round skips versions instead of piling them up
  rounds.Finish("e", 2);
  EXPECT_TRUE(rounds.Due(24).empty());
  EXPECT_EQ(rounds.Due(25), std::vector<std::string>{"e"});
  ASSERT_EQ(rounds.Find("e")->history.size(), 2u);
  EXPECT_EQ(rounds.Find("e")->history[1].version(), 20);
}

TEST(EvalRoundsTest, MeanRewardIsOverSamplesAndPassAtKOverScoredPrompts) {
  EvalRounds rounds;
  prl::v1::EvalSpec spec;
  spec.set_every_versions(1);
  spec.set_pass_reward(0.5);
  rounds.Add("e", spec, 3);
  rounds.Scored("e", Group({1, 1, 1}));  // before any round: not counted
  rounds.Open("e", 4);
  rounds.Scored("e", Group({0, 0.5, 0}, 4, 5));  // passes (0.5 >= 0.5)
  rounds.Scored("e", Group({0.4, 0, 0}, 5, 7));  // does not
  rounds.Scored("e", Group({1, 1, 0.2}, 4, 4));  // passes
  rounds.Failed("e");
  const prl::v1::EvalRoundResult r = rounds.Finish("e", 99);
  EXPECT_EQ(r.version(), 4);
  EXPECT_EQ(r.prompts(), 3);
  EXPECT_EQ(r.prompts_failed(), 1);
  EXPECT_EQ(r.samples(), 9);
  EXPECT_EQ(r.k(), 3);
  EXPECT_DOUBLE_EQ(r.mean_reward(), (0.5 + 0.4 + 2.2) / 9);
  EXPECT_DOUBLE_EQ(r.pass_at_k(), 2.0 / 3);
  EXPECT_EQ(r.finished_unix_ms(), 99);
  EXPECT_EQ(r.min_weight_version(), 4);  // the weights the samples were generated with
  EXPECT_EQ(r.max_weight_version(), 7);
  // The next round starts from zero.
  rounds.Open("e", 6);
  rounds.Scored("e", Group({0, 0, 0}));
  EXPECT_DOUBLE_EQ(rounds.Finish("e", 100).pass_at_k(), 0.0);
}

TEST(EvalRoundsTest, ThePassRewardDefaultsToOneAndTheHistoryIsBounded) {
  EvalRounds rounds;
  prl::v1::EvalSpec spec;
  spec.set_every_versions(1);
  rounds.Add("e", spec, 1);
  rounds.Open("e", 0);
  rounds.Scored("e", Group({0.99}));
  EXPECT_EQ(rounds.Finish("e", 1).pass_at_k(), 0.0);
  for (int64_t v = 1; v <= static_cast<int64_t>(EvalRounds::kMaxHistory) + 5; ++v) {
    rounds.Open("e", v);
    rounds.Finish("e", v);
  }
  EXPECT_EQ(rounds.Find("e")->history.size(), EvalRounds::kMaxHistory);
  EXPECT_EQ(rounds.Find("e")->history.front().version(), 6);
  rounds.Remove("e");
  EXPECT_FALSE(rounds.Contains("e"));
  EXPECT_TRUE(rounds.Due(10000).empty());
}

TEST(EvalRoundsTest, RestoredRoundsRebuildTheHistoryAndTheSchedule) {
  EvalRounds rounds;
  prl::v1::EvalSpec spec;
  spec.set_every_versions(10);
  rounds.Add("e", spec, 1);
  prl::v1::EvalRoundResult r;
  r.set_version(30);
  r.set_mean_reward(0.25);
  rounds.Restore("e", r);
  EXPECT_TRUE(rounds.Due(39).empty());
  EXPECT_EQ(rounds.Due(40), std::vector<std::string>{"e"});
  EXPECT_EQ(rounds.Find("e")->history.back().mean_reward(), 0.25);
}

}  // namespace
}  // namespace prl::coordinator
