// prl run's GPU placement (runner/gpu_plan.h): the learner takes one GPU per rank, actors the
// rest round-robin, and share the learner's GPU within the stated KV-cache budget when none is
// left; impossible placements are errors naming the keys and counts.
#include "runner/gpu_plan.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace prl::runner {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

config::RunConfig Config(DeviceType learner, int world_size, DeviceType actors, int count,
                         double fraction = 0.2) {
  config::RunConfig c;
  c.learner.device = learner;
  c.learner.world_size = world_size;
  c.actors.device = actors;
  c.actors.count = count;
  c.actors.gpu_memory_fraction = fraction;
  return c;
}

constexpr DeviceType kCpu = DeviceType::kCpu, kCuda = DeviceType::kCuda;

TEST(GpuPlanTest, EverythingOnTheCpuSeesNoGpu) {
  absl::StatusOr<GpuPlan> plan = PlanGpus(Config(kCpu, 2, kCpu, 3), {"0", "1"});
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->learner, "");
  EXPECT_THAT(plan->actors, ElementsAre("", "", ""));
  EXPECT_TRUE(plan->description.empty());
}

TEST(GpuPlanTest, TheLearnerTakesOneGpuPerRankAndActorsTheRestRoundRobin) {
  absl::StatusOr<GpuPlan> plan = PlanGpus(Config(kCuda, 2, kCuda, 3), {"0", "1", "2", "3"});
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->learner, "0,1");
  EXPECT_THAT(plan->actors, ElementsAre("2", "3", "2"));
  EXPECT_FALSE(plan->shared);
  EXPECT_THAT(plan->description, HasSubstr("learner on [0,1], actors on [2,3,2]"));
}

TEST(GpuPlanTest, IdsAreThoseTheParentSees) {
  absl::StatusOr<GpuPlan> plan = PlanGpus(Config(kCuda, 1, kCuda, 2), {"5", "7"});
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->learner, "5");
  EXPECT_THAT(plan->actors, ElementsAre("7", "7"));
}

TEST(GpuPlanTest, OnOneGpuActorsShareItWithTheLearnerWithinTheirBudget) {
  absl::StatusOr<GpuPlan> plan = PlanGpus(Config(kCuda, 1, kCuda, 2, 0.25), {"0"});
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->learner, "0");
  EXPECT_THAT(plan->actors, ElementsAre("0", "0"));
  EXPECT_TRUE(plan->shared);
  EXPECT_THAT(plan->description, HasSubstr("shared with the learner"));
  // Three actors at 0.25 would take 0.75 of the GPU: more than the 0.6 the learner leaves.
  absl::StatusOr<GpuPlan> over = PlanGpus(Config(kCuda, 1, kCuda, 3, 0.25), {"0"});
  EXPECT_EQ(over.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(
      over.status().message(),
      HasSubstr("actors.gpu_memory_fraction = 0.25: 3 actors share GPU 0 with the learner"));
  EXPECT_THAT(over.status().message(), HasSubstr("lower actors.gpu_memory_fraction to 0.2"));
}

TEST(GpuPlanTest, ActorsOnGpusBesideACpuLearnerUseEveryGpu) {
  absl::StatusOr<GpuPlan> plan = PlanGpus(Config(kCpu, 1, kCuda, 2), {"0"});
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->learner, "");
  EXPECT_THAT(plan->actors, ElementsAre("0", "0"));
  EXPECT_FALSE(plan->shared);
}

TEST(GpuPlanTest, ImpossiblePlacementsNameTheKeysAndCounts) {
  absl::StatusOr<GpuPlan> too_few = PlanGpus(Config(kCuda, 2, kCpu, 1), {"0"});
  EXPECT_EQ(too_few.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(too_few.status().message(),
              HasSubstr("learner.world_size = 2 with learner.device = cuda needs 2 GPUs (one per "
                        "rank) but 1 are visible"));
  absl::StatusOr<GpuPlan> none = PlanGpus(Config(kCpu, 1, kCuda, 1), {});
  EXPECT_THAT(none.status().message(), HasSubstr("actors.device = cuda: no GPU is visible"));
}

}  // namespace
}  // namespace prl::runner
