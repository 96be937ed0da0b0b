// A group's advantages are its episodes' (learner/step_intake.h EpisodeAdvantages): an agent's
// episode of several records (segments) counts once in the group's mean and every one of its
// records takes the episode's advantage.
#include <gtest/gtest.h>

#include <vector>

#include "learner/step_intake.h"
#include "replay/rollout_record.h"

namespace prl::learner {
namespace {

RolloutRecord Segment(uint32_t episode, uint32_t segment, uint32_t segments, double reward) {
  RolloutRecord r;
  r.group_size = 3;
  r.sample_index = episode;
  r.segment = segment;
  r.segments = segments;
  r.reward = reward;
  return r;
}

TEST(EpisodeAdvantagesTest, AnEpisodeOfSeveralRecordsCountsOnceAndEachRecordTakesItsAdvantage) {
  // Episode 0 (reward 1) one record; episode 1 (reward 0) three; episode 2 (reward 0) one.
  const std::vector<RolloutRecord> records = {Segment(1, 0, 3, 0.0), Segment(0, 0, 1, 1.0),
                                              Segment(1, 2, 3, 0.0), Segment(2, 0, 1, 0.0),
                                              Segment(1, 1, 3, 0.0)};
  AdvantageConfig config;
  config.scale_by_std = false;  // Dr. GRPO: reward - the mean of the episodes' rewards (1/3)
  const absl::StatusOr<EpisodeAdvantagesResult> got = EpisodeAdvantages(records, config);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->episode_rewards, (std::vector<double>{0.0, 1.0, 0.0}));
  const std::vector<double> want = {-1.0 / 3, 2.0 / 3, -1.0 / 3, -1.0 / 3, -1.0 / 3};
  ASSERT_EQ(got->advantage.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_NEAR(got->advantage[i], want[i], 1e-12) << "record " << i;
    EXPECT_TRUE(got->kept[i]);
  }
}

TEST(EpisodeAdvantagesTest, AUniformGroupIsDroppedForEveryRecordOfEveryEpisode) {
  const std::vector<RolloutRecord> records = {Segment(0, 0, 2, 1.0), Segment(0, 1, 2, 1.0),
                                              Segment(1, 0, 1, 1.0), Segment(2, 0, 1, 1.0)};
  AdvantageConfig config;
  config.drop_uniform_groups = true;
  const absl::StatusOr<EpisodeAdvantagesResult> got = EpisodeAdvantages(records, config);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->kept, (std::vector<bool>(4, false)));
}

}  // namespace
}  // namespace prl::learner
