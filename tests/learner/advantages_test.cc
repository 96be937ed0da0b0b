#include "learner/advantages.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

namespace prl::learner {
namespace {

using Ids = std::vector<std::string>;

AdvantageConfig Grpo() { return AdvantageConfig{}; }
AdvantageConfig DrGrpo() {
  AdvantageConfig c;
  c.scale_by_std = false;
  return c;
}

TEST(GroupAdvantagesTest, GrpoDividesByTheBesselCorrectedStd) {
  // Rewards (0, 1, 2): mean 1, sample std sqrt((1 + 0 + 1) / 2) = 1 (the population std,
  // sqrt(2 / 3), would give +-1.22).
  const absl::StatusOr<Advantages> a = GroupAdvantages({0, 1, 2}, Ids{"g", "g", "g"}, Grpo());
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_DOUBLE_EQ(a->advantage[0], -1 / (1 + 1e-6));
  EXPECT_DOUBLE_EQ(a->advantage[1], 0);
  EXPECT_DOUBLE_EQ(a->advantage[2], 1 / (1 + 1e-6));
  EXPECT_EQ(a->groups, 1);
  EXPECT_EQ(a->dropped_groups, 0);

  // Binary rewards (1, 0, 0, 1): mean 0.5, std sqrt(4 * 0.25 / 3) = 1 / sqrt(3).
  const absl::StatusOr<Advantages> b =
      GroupAdvantages({1, 0, 0, 1}, Ids{"p", "p", "p", "p"}, Grpo());
  ASSERT_TRUE(b.ok());
  const double expected = 0.5 / (1 / std::sqrt(3.0) + 1e-6);
  EXPECT_DOUBLE_EQ(b->advantage[0], expected);
  EXPECT_DOUBLE_EQ(b->advantage[1], -expected);
  EXPECT_DOUBLE_EQ(b->advantage[2], -expected);
  EXPECT_DOUBLE_EQ(b->advantage[3], expected);
}

TEST(GroupAdvantagesTest, DrGrpoOnlySubtractsTheMean) {
  const absl::StatusOr<Advantages> a = GroupAdvantages({3, 5, 10}, Ids{"g", "g", "g"}, DrGrpo());
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->advantage, (std::vector<double>{-3, -1, 4}));
}

TEST(GroupAdvantagesTest, InterleavedGroupsAreNormalisedSeparatelyInInputOrder) {
  // a: (0, 1, 2) as above; b: (5, 5, 8), mean 6, std sqrt((1 + 1 + 4) / 2) = sqrt(3).
  const absl::StatusOr<Advantages> a =
      GroupAdvantages({0, 5, 1, 5, 2, 8}, Ids{"a", "b", "a", "b", "a", "b"}, Grpo());
  ASSERT_TRUE(a.ok());
  const double sb = std::sqrt(3.0) + 1e-6;
  const std::vector<double> expected = {-1 / (1 + 1e-6), -1 / sb,        0,
                                        -1 / sb,         1 / (1 + 1e-6), 2 / sb};
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_NEAR(a->advantage[i], expected[i], 1e-15) << "sample " << i;
  }
  EXPECT_EQ(a->groups, 2);
  EXPECT_EQ(a->kept, std::vector<bool>(6, true));
}

TEST(GroupAdvantagesTest, GroupOfOneHasZeroAdvantage) {
  for (const AdvantageConfig& config : {Grpo(), DrGrpo()}) {
    const absl::StatusOr<Advantages> a =
        GroupAdvantages({7.5, 1, 0}, Ids{"alone", "pair", "pair"}, config);
    ASSERT_TRUE(a.ok());
    EXPECT_EQ(a->advantage[0], 0);
    EXPECT_TRUE(a->kept[0]);
    EXPECT_EQ(a->groups, 2);
    EXPECT_EQ(a->dropped_groups, 0);
  }
}

TEST(GroupAdvantagesTest, UniformGroupsAreDroppedAndCountedOrGetExactlyZero) {
  // 0.1 three times: the rounded mean differs from 0.1, the advantage must still be 0.
  const std::vector<double> rewards = {0.1, 1, 0.1, 0, 0.1, 4, 4, 9};
  const Ids ids = {"u", "x", "u", "x", "u", "v", "v", "one"};
  const absl::StatusOr<Advantages> kept = GroupAdvantages(rewards, ids, Grpo());
  ASSERT_TRUE(kept.ok());
  for (size_t i : {0, 2, 4, 5, 6, 7}) EXPECT_EQ(kept->advantage[i], 0.0) << "sample " << i;
  EXPECT_EQ(kept->dropped_groups, 0);

  AdvantageConfig drop = Grpo();
  drop.drop_uniform_groups = true;
  const absl::StatusOr<Advantages> dropped = GroupAdvantages(rewards, ids, drop);
  ASSERT_TRUE(dropped.ok());
  EXPECT_EQ(dropped->groups, 4);
  EXPECT_EQ(dropped->dropped_groups, 3) << "u, v and the group of one";
  EXPECT_EQ(dropped->kept,
            (std::vector<bool>{false, true, false, true, false, false, false, false}));
  // The surviving group is untouched: (1, 0), mean 0.5, std sqrt(0.5).
  EXPECT_DOUBLE_EQ(dropped->advantage[1], 0.5 / (std::sqrt(0.5) + 1e-6));
  EXPECT_DOUBLE_EQ(dropped->advantage[3], -0.5 / (std::sqrt(0.5) + 1e-6));
  EXPECT_EQ(dropped->advantage[1], kept->advantage[1]);
}

TEST(GroupAdvantagesTest, NonFiniteRewardIsAnErrorNamingTheSample) {
  const absl::StatusOr<Advantages> a =
      GroupAdvantages({1, 0, std::nan("")}, Ids{"g", "g", "h"}, Grpo());
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(a.status().message().find("reward of sample 2 (group \"h\") is nan"),
            absl::string_view::npos)
      << a.status().message();
  EXPECT_NE(GroupAdvantages({INFINITY}, Ids{"g"}, Grpo()).status().message().find("sample 0"),
            absl::string_view::npos);
}

TEST(GroupAdvantagesTest, MismatchedSizesAndBadEpsAreErrors) {
  const absl::StatusOr<Advantages> a = GroupAdvantages({1, 2}, Ids{"g"}, Grpo());
  EXPECT_NE(a.status().message().find("group_ids has 1 entries, expected 2"),
            absl::string_view::npos)
      << a.status().message();
  AdvantageConfig bad = Grpo();
  bad.eps = -1;
  EXPECT_NE(GroupAdvantages({1}, Ids{"g"}, bad).status().message().find("eps must be"),
            absl::string_view::npos);
}

TEST(GroupAdvantagesTest, NoSamplesGiveNoGroups) {
  const absl::StatusOr<Advantages> a = GroupAdvantages({}, Ids{}, Grpo());
  ASSERT_TRUE(a.ok());
  EXPECT_TRUE(a->advantage.empty());
  EXPECT_EQ(a->groups, 0);
}

}  // namespace
}  // namespace prl::learner
