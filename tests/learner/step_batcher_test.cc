// The step batcher of a run of adapters (learner/step_batcher.h), on one rank's frozen base with
// three adapters, each trainer a thread:
// - steps handed in while their trainers were all on their way train in one round (one joint
//   step), each adapter ending where its own step ends;
// - a member waiting for groups does not hold a round back; a busy one (its step coming) is
//   waited for, so adapters ready together step together; a member that leaves is not waited
//   for;
// - a step's own error (its settings) fails that step alone: the others train in the round;
// - steps that cannot be joint (another temperature) still train, one after another.
#include "learner/step_batcher.h"

#include <gtest/gtest.h>

#include <memory>
#include <thread>
#include <vector>

#include "core/status_macros.h"
#include "learner/step_turns.h"
#include "tests/learner/adapter_rank_testing.h"
#include "tests/learner/learner_testing.h"

namespace prl::learner {
namespace {

using ::prl::learner::testing::MaxRelativeDifference;
using ::prl::learner::testing::RunRanks;
using ::prl::learner::testing::ScratchDir;
using ::prl::learner::testing::TestAdapterRank;

// Runs `body` on a rank of three adapters; returns its status.
absl::Status OnRank(const std::function<absl::Status(TestAdapterRank&)>& body) {
  ScratchDir dir("step_batcher");
  return RunRanks(1, [&](int, collective::Communicator& comm) -> absl::Status {
    PRL_ASSIGN_OR_RETURN(std::unique_ptr<TestAdapterRank> rank,
                         TestAdapterRank::Make(comm, dir.path(), 40));
    return body(*rank);
  })[0];
}

TEST(StepBatcherTest, StepsHandedInTogetherTrainInOneRoundAsTheirOwnSteps) {
  std::vector<std::vector<float>> separate, batched;
  ASSERT_TRUE(OnRank([&](TestAdapterRank& rank) -> absl::Status {
                for (auto& a : rank.adapters) {
                  PRL_RETURN_IF_ERROR(
                      TrainStep(*a.model, *a.optimizer, a.samples, a.step, 3).status());
                  PRL_ASSIGN_OR_RETURN(std::vector<float> p, a.Params());
                  separate.push_back(p);
                }
                return absl::OkStatus();
              }).ok());
  ASSERT_TRUE(OnRank([&](TestAdapterRank& rank) -> absl::Status {
                StepTurns turns;
                StepBatcher batcher(&turns, 4096);
                std::vector<std::unique_ptr<StepBatcher::Member>> members;
                for (size_t k = 0; k < rank.adapters.size(); ++k) members.push_back(batcher.Join());
                std::vector<absl::StatusOr<StepResult>> results(rank.adapters.size(),
                                                                absl::UnknownError("not run"));
                std::vector<std::thread> trainers;
                for (size_t k = 0; k < rank.adapters.size(); ++k) {
                  trainers.emplace_back(
                      [&, k] { results[k] = members[k]->Train(rank.adapters[k].Step()); });
                }
                for (std::thread& t : trainers) t.join();
                EXPECT_EQ(batcher.rounds(), 1);
                EXPECT_EQ(batcher.steps(), 3);
                for (size_t k = 0; k < rank.adapters.size(); ++k) {
                  EXPECT_TRUE(results[k].ok()) << results[k].status();
                  PRL_ASSIGN_OR_RETURN(std::vector<float> p, rank.adapters[k].Params());
                  batched.push_back(p);
                }
                return absl::OkStatus();
              }).ok());
  ASSERT_EQ(batched.size(), separate.size());
  for (size_t k = 0; k < separate.size(); ++k) {
    EXPECT_LE(MaxRelativeDifference(batched[k], separate[k]), 1e-5) << "adapter " << k;
  }
}

TEST(StepBatcherTest, AWaitingMemberDoesNotHoldARoundBackABusyOneIsWaitedFor) {
  ASSERT_TRUE(OnRank([&](TestAdapterRank& rank) -> absl::Status {
                StepTurns turns;
                StepBatcher batcher(&turns, 4096);
                std::unique_ptr<StepBatcher::Member> a = batcher.Join(), b = batcher.Join(),
                                                     c = batcher.Join();
                // c waits for groups, a and b step: a's step waits for b's (busy), not c's.
                c->Waiting();
                std::thread first([&] { EXPECT_TRUE(a->Train(rank.adapters[0].Step()).ok()); });
                EXPECT_TRUE(b->Train(rank.adapters[1].Step()).ok());
                first.join();
                EXPECT_EQ(batcher.rounds(), 1) << "a waited for b, not for c";
                EXPECT_EQ(batcher.steps(), 2);
                // b leaves while busy, c stays waiting: a's next step is not held back.
                b.reset();
                EXPECT_TRUE(a->Train(rank.adapters[0].Step(4)).ok());
                EXPECT_EQ(batcher.rounds(), 2);
                // c's groups are in (busy: its step is coming), a is busy after its round: one
                // round takes both, whichever hands its step in first.
                c->Busy();
                std::thread third([&] { EXPECT_TRUE(c->Train(rank.adapters[2].Step()).ok()); });
                EXPECT_TRUE(a->Train(rank.adapters[0].Step(5)).ok());
                third.join();
                EXPECT_EQ(batcher.rounds(), 3);
                EXPECT_EQ(batcher.steps(), 5);
                return absl::OkStatus();
              }).ok());
}

TEST(StepBatcherTest, AStepsOwnErrorFailsItAloneAndUnjoinableStepsStillTrain) {
  ASSERT_TRUE(
      OnRank([&](TestAdapterRank& rank) -> absl::Status {
        StepTurns turns;
        StepBatcher batcher(&turns, 4096);
        rank.adapters[1].step.micro_batch_tokens = 0;  // this step's own error
        rank.adapters[2].step.temperature = 0.5f;      // not joint with the others
        std::vector<std::unique_ptr<StepBatcher::Member>> members;
        for (size_t k = 0; k < 3; ++k) members.push_back(batcher.Join());
        std::vector<absl::StatusOr<StepResult>> results(3, absl::UnknownError("not run"));
        std::vector<std::thread> trainers;
        for (size_t k = 0; k < 3; ++k) {
          trainers.emplace_back(
              [&, k] { results[k] = members[k]->Train(rank.adapters[k].Step()); });
        }
        for (std::thread& t : trainers) t.join();
        EXPECT_TRUE(results[0].ok()) << results[0].status();
        EXPECT_FALSE(results[1].ok());
        EXPECT_NE(results[1].status().message().find("micro_batch_tokens"), std::string::npos)
            << results[1].status();
        EXPECT_TRUE(results[2].ok()) << results[2].status();
        for (size_t k : {0, 2}) {
          PRL_ASSIGN_OR_RETURN(std::vector<float> p, rank.adapters[k].Params());
          EXPECT_GT(MaxRelativeDifference(p, rank.adapters[k].start), 1e-3)
              << "adapter " << k << " trained";
        }
        PRL_ASSIGN_OR_RETURN(std::vector<float> p, rank.adapters[1].Params());
        EXPECT_EQ(p, rank.adapters[1].start) << "the failed step changed nothing";
        return absl::OkStatus();
      }).ok());
}

}  // namespace
}  // namespace prl::learner
