// Leases and the max_lag budget: expiry and heartbeats, who may complete a lease, and the
// budget through learner reports and restarts of either side.
#include "coordinator/lag_budget.h"

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "coordinator/coordinator.h"
#include "tests/coordinator/coordinator_fixture.h"
#include "tests/status_testing.h"

namespace prl::coordinator {
namespace {

namespace v1 = prl::v1;
using ::prl::testing::IsError;

// The budget on its own (coordinator/lag_budget.h): (max_lag + 1) * groups_per_step minus what
// is in flight and what the learner has not trained; the backlog counted from the reply a
// report echoes; out-of-bounds reports change nothing.
TEST(LagBudgetTest, TheBudgetFollowsTheLearnersBacklogAndRefusesOutOfBoundsReports) {
  LagBudget budget(/*max_lag=*/1, /*groups_per_step=*/4, /*sync=*/false, /*groups_completed=*/10);
  EXPECT_EQ(budget.Allowed(100, /*in_flight=*/3, /*groups_completed=*/10), 5) << "(1 + 1) * 4 - 3";
  EXPECT_EQ(budget.Allowed(100, 0, 14), 4) << "4 completions since start, none reported trained";
  absl::StatusOr<v1::LearnerProgressResponse> first =
      budget.Report(1, 4, /*waiting=*/2, nullptr, 14);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(budget.Unconsumed(14), 2) << "the learner's backlog";
  EXPECT_EQ(budget.Unconsumed(16), 4) << "plus the completions since the report";
  // The next report echoes the first reply: completions after it are unseen by the learner.
  ASSERT_TRUE(budget.Report(2, 8, /*waiting=*/0, &*first, 16).ok());
  EXPECT_EQ(budget.Unconsumed(16), 2) << "16 - 14 completions since the echoed reply";
  budget.ForgetCompletion(16);  // one of them was handed back, never to be trained
  EXPECT_EQ(budget.Unconsumed(16), 1);
  EXPECT_EQ(budget.learner_version(), 2);
  EXPECT_EQ(budget.Report(2 + LagBudget::kMaxVersionStep + 1, 8, 0, nullptr, 16).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(budget.Report(3, -1, 0, nullptr, 16).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(budget.learner_version(), 2) << "a refused report changes nothing";
  LagBudget sync(/*max_lag=*/4, /*groups_per_step=*/4, /*sync=*/true, 0);
  EXPECT_EQ(sync.Allowed(100, 1, 0), 3) << "sync mode: a budget of max_lag 0";
  LagBudget none(4, /*groups_per_step=*/0, false, 0);
  EXPECT_EQ(none.Allowed(100, 50, 50), 100) << "groups_per_step 0: no budget";
}

TEST_F(CoordinatorTest, AnExpiredLeaseIsReRunAndTheLateCompletionIsADuplicate) {
  config_.lease_ms = 200;
  config_.heartbeat_ms = 50;
  auto c = Open();
  const std::string id = c->Submit(Request(1))->prompt_set_id();
  const std::string dead = c->RegisterActor("dies")->actor_id();
  auto first = c->Lease(LeaseOf(dead, 1));
  ASSERT_EQ(first->prompts_size(), 1);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const std::string alive = c->RegisterActor("lives")->actor_id();
  auto second = c->Lease(LeaseOf(alive, 1));
  ASSERT_EQ(second->prompts_size(), 1) << "the expired lease was not re-queued";
  EXPECT_EQ(second->prompts(0).prompt_index(), 0);
  EXPECT_TRUE(c->Complete(Done(alive, second->prompts(0))).value().accepted());
  EXPECT_FALSE(c->Complete(Done(dead, first->prompts(0))).value().accepted());
  EXPECT_EQ(c->Stats().leases_expired, 1);
  EXPECT_EQ(c->Get(id)->prompts_done(), 1);
}

TEST_F(CoordinatorTest, HeartbeatsKeepTheLeasesTheyListAlive) {
  config_.lease_ms = 300;
  config_.heartbeat_ms = 50;
  auto c = Open();
  c->Submit(Request(1)).IgnoreError();
  const std::string actor = c->RegisterActor("a")->actor_id();
  auto leased = c->Lease(LeaseOf(actor, 1));
  ASSERT_EQ(leased->prompts_size(), 1);
  v1::HeartbeatRequest hb;
  hb.set_actor_id(actor);
  hb.add_held_lease_ids(leased->prompts(0).lease_id());
  for (int i = 0; i < 8; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    ASSERT_TRUE(c->Heartbeat(hb).ok());
    c->ExpireLeases();
  }
  EXPECT_EQ(c->Stats().leases_expired, 0);
  EXPECT_TRUE(c->Complete(Done(actor, leased->prompts(0))).value().accepted());
}

// Expiry looks at the leases only once the earliest deadline may have passed: a renewal moves
// that deadline later, and a lease leased after the first one still expires on time.
TEST_F(CoordinatorTest, ALeaseExpiresOnTimeAfterAnotherLeaseWasRenewedPastIt) {
  config_.lease_ms = 1000;
  config_.heartbeat_ms = 50;
  auto c = Open();
  c->Submit(Request(3)).IgnoreError();
  const std::string renewing = c->RegisterActor("renews")->actor_id();
  const std::string silent = c->RegisterActor("silent")->actor_id();
  const std::string other = c->RegisterActor("other")->actor_id();
  auto first = c->Lease(LeaseOf(renewing, 1));  // t = 0: deadline 1000 ms
  ASSERT_EQ(first->prompts_size(), 1);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  auto second = c->Lease(LeaseOf(silent, 1));  // t = 500: deadline 1500 ms
  ASSERT_EQ(second->prompts_size(), 1);
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  v1::HeartbeatRequest hb;  // t = 900: the first lease's deadline moves to 1900 ms
  hb.set_actor_id(renewing);
  hb.add_held_lease_ids(first->prompts(0).lease_id());
  ASSERT_TRUE(c->Heartbeat(hb).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(c->Lease(LeaseOf(other, 0))->prompts_size(), 0);  // t = 1200: past 1000, none due
  EXPECT_EQ(c->Stats().leases_expired, 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  auto rerun = c->Lease(LeaseOf(other, 1));  // t = 1700: the second lease is due, not the first
  EXPECT_EQ(c->Stats().leases_expired, 1);
  ASSERT_EQ(rerun->prompts_size(), 1);
  EXPECT_EQ(rerun->prompts(0).prompt_index(), second->prompts(0).prompt_index());
  EXPECT_TRUE(c->Complete(Done(renewing, first->prompts(0))).value().accepted());
}

TEST_F(CoordinatorTest, ALeaseAHeartbeatNoLongerListsIsReQueuedAtOnce) {
  auto c = Open();
  const std::string id = c->Submit(Request(2))->prompt_set_id();
  const std::string actor = c->RegisterActor("a")->actor_id();
  auto leased = c->Lease(LeaseOf(actor, 2));
  ASSERT_EQ(leased->prompts_size(), 2);
  v1::HeartbeatRequest hb;
  hb.set_actor_id(actor);
  hb.add_held_lease_ids(leased->prompts(1).lease_id());  // the first group was dropped
  ASSERT_TRUE(c->Heartbeat(hb).ok());
  EXPECT_EQ(c->Stats().leases_dropped, 1);
  EXPECT_EQ(c->Get(id)->prompts_in_flight(), 1);
  auto again = c->Lease(LeaseOf(actor, 1));
  ASSERT_EQ(again->prompts_size(), 1);
  EXPECT_EQ(again->prompts(0).prompt_index(), leased->prompts(0).prompt_index());
  // The old lease is gone: its completion is refused.
  EXPECT_EQ(c->Complete(Done(actor, leased->prompts(0))).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(CoordinatorTest, TheMaxLagBudgetBoundsWorkInFlightPlusUntrainedGroups) {
  config_.max_lag = 1;
  config_.groups_per_step = 2;  // at most (1 + 1) * 2 = 4 groups ahead of the learner
  auto c = Open();
  c->Submit(Request(10)).IgnoreError();
  const std::string actor = c->RegisterActor("a")->actor_id();
  auto leased = c->Lease(LeaseOf(actor, 10));
  ASSERT_EQ(leased->prompts_size(), 4);
  for (int i = 0; i < 2; ++i) ASSERT_TRUE(c->Complete(Done(actor, leased->prompts(i))).ok());
  EXPECT_EQ(c->Lease(LeaseOf(actor, 10))->prompts_size(), 0) << "completed but not trained on";
  ASSERT_TRUE(c->LearnerProgress(1, 2).ok());
  EXPECT_EQ(c->Lease(LeaseOf(actor, 10))->prompts_size(), 2);
}

TEST_F(CoordinatorTest, OnlyTheActorHoldingALeaseCompletesItAndNothingChangesOtherwise) {
  auto c = Open();
  const std::string id = c->Submit(Request(1))->prompt_set_id();
  const std::string owner = c->RegisterActor("owner")->actor_id();
  const std::string thief = c->RegisterActor("thief")->actor_id();
  auto leased = c->Lease(LeaseOf(owner, 1));
  ASSERT_EQ(leased->prompts_size(), 1);
  // Another actor's id with the right lease, and the owner's id with a forged nonce.
  const absl::Status foreign = c->Complete(Done(thief, leased->prompts(0))).status();
  EXPECT_EQ(foreign.code(), absl::StatusCode::kFailedPrecondition) << foreign;
  EXPECT_NE(foreign.message().find("is not held by actor"), absl::string_view::npos);
  v1::CompleteRequest forged = Done(owner, leased->prompts(0));
  forged.set_lease_id(forged.lease_id().substr(0, forged.lease_id().rfind(':') + 1) + "deadbeef");
  EXPECT_EQ(c->Complete(forged).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(c->Stats().rejected_completions, 2);
  EXPECT_EQ(c->Get(id)->prompts_done(), 0) << "nothing changed";
  EXPECT_EQ(c->Get(id)->prompts_in_flight(), 1);
  EXPECT_TRUE(c->Complete(Done(owner, leased->prompts(0))).value().accepted());
}

TEST_F(CoordinatorTest, LearnerProgressOutOfBoundsIsRefusedAndDoesNotPoisonTheBudget) {
  config_.max_lag = 0;
  config_.groups_per_step = 1;
  auto c = Open();
  ASSERT_TRUE(c->Submit(Request(5)).ok());
  const std::string actor = c->RegisterActor("a")->actor_id();
  auto leased = c->Lease(LeaseOf(actor, 5));
  ASSERT_EQ(leased->prompts_size(), 1);
  ASSERT_TRUE(c->Complete(Done(actor, leased->prompts(0))).ok());
  ASSERT_TRUE(c->LearnerProgress(3, 0, /*groups_waiting=*/1).ok());  // not trained on yet
  // A version far ahead of the learner's, negative counts: lies, refused.
  const absl::Status jump = c->LearnerProgress(1'000'000, 1).status();
  EXPECT_EQ(jump.code(), absl::StatusCode::kFailedPrecondition) << jump;
  EXPECT_NE(jump.message().find("version <= 1003"), absl::string_view::npos) << jump;
  EXPECT_EQ(c->LearnerProgress(-1, 0).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(c->LearnerProgress(4, 1, -5).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(c->Stats().rejected_progress, 3);
  EXPECT_EQ(c->Stats().learner_version, 3);
  EXPECT_EQ(c->Lease(LeaseOf(actor, 5))->prompts_size(), 0) << "the budget did not move";
  ASSERT_TRUE(c->LearnerProgress(4, 1, 0).ok());
  EXPECT_EQ(c->Lease(LeaseOf(actor, 5))->prompts_size(), 1);
}

// The learner reads its backlog, then the report travels: a completion that reaches the
// coordinator in between is in neither the backlog nor "completed since the report". With the
// learner echoing the reply to its previous report (read before the backlog), the coordinator
// counts every completion after that reply on top of the backlog: that one too.
TEST_F(CoordinatorTest, ACompletionThatOvertakesAReportThatMissedItStillCountsAgainstTheBudget) {
  config_.max_lag = 0;
  config_.groups_per_step = 1;  // a budget of one group
  auto c = Open();
  ASSERT_TRUE(c->Submit(Request(5)).ok());
  const std::string actor = c->RegisterActor("a")->actor_id();
  const v1::LearnerProgressResponse before = *c->LearnerProgress(0, 0, 0);  // first report
  auto leased = c->Lease(LeaseOf(actor, 5));
  ASSERT_EQ(leased->prompts_size(), 1);
  ASSERT_TRUE(c->Complete(Done(actor, leased->prompts(0))).ok());
  // Read before that group reached the buffer: a backlog of 0, the reply from before.
  const v1::LearnerProgressResponse after = *c->LearnerProgress(0, 0, 0, &before);
  EXPECT_EQ(c->Lease(LeaseOf(actor, 5))->prompts_size(), 0) << "the group is still untrained";
  EXPECT_EQ(c->Stats().groups_unconsumed, 1);
  // Trained: the next report (read after the reply above) sees an empty backlog.
  ASSERT_TRUE(c->LearnerProgress(1, 1, 0, &after).ok());
  EXPECT_EQ(c->Lease(LeaseOf(actor, 5))->prompts_size(), 1);
}

// A learner that echoes a reply of the coordinator before a restart: every completion since
// this coordinator started may be missing from its backlog, and counts.
TEST_F(CoordinatorTest, AnEchoOfAPredecessorsReplyCountsEveryCompletionSinceTheRestart) {
  config_.max_lag = 0;
  config_.groups_per_step = 1;
  v1::LearnerProgressResponse old_reply;
  {
    auto c = Open();
    ASSERT_TRUE(c->Submit(Request(5)).ok());
    old_reply = *c->LearnerProgress(0, 0, 0);
  }
  auto c = Open();
  const std::string actor = c->RegisterActor("a")->actor_id();
  auto leased = c->Lease(LeaseOf(actor, 5));
  ASSERT_EQ(leased->prompts_size(), 1);
  ASSERT_TRUE(c->Complete(Done(actor, leased->prompts(0))).ok());
  EXPECT_NE(c->LearnerProgress(0, 0, 0)->coordinator_start(), old_reply.coordinator_start());
  ASSERT_TRUE(c->LearnerProgress(0, 0, 0, &old_reply).ok());
  EXPECT_EQ(c->Lease(LeaseOf(actor, 5))->prompts_size(), 0) << "the group is still untrained";
}

TEST_F(CoordinatorTest, TheBudgetFollowsARestartedLearnerThatCountsFromZero) {
  // The learner trained 4 groups and reported so; a new learner that lost that progress (no
  // checkpoint) starts again at 0. With a budget of 1 group, every group it trains must let
  // the next one be leased: a running total kept across learners would stall here.
  config_.max_lag = 0;
  config_.groups_per_step = 1;
  auto c = Open();
  ASSERT_TRUE(c->Submit(Request(10)).ok());
  const std::string actor = c->RegisterActor("a")->actor_id();
  const auto produce_one = [&] {
    auto leased = c->Lease(LeaseOf(actor, 5));
    if (leased->prompts_size() != 1) return false;
    return c->Complete(Done(actor, leased->prompts(0))).ok();
  };
  for (int64_t i = 1; i <= 4; ++i) {
    ASSERT_TRUE(produce_one());
    ASSERT_TRUE(c->LearnerProgress(i, i, 0).ok());
  }
  for (int64_t i = 1; i <= 4; ++i) {  // the restarted learner
    ASSERT_TRUE(produce_one()) << "stalled at the new learner's group " << i;
    ASSERT_TRUE(c->LearnerProgress(4 + i, i, 0).ok());
  }
}

TEST_F(CoordinatorTest, TheBudgetStartsFromAnEmptyBacklogWhenTheCoordinatorRestarts) {
  // Groups completed before a restart were trained or are in the learner's backlog; the
  // restarted coordinator has no report yet. It must lease (the learner may be waiting for a
  // full step and send nothing until it has one), then follow the learner's reports.
  config_.max_lag = 0;
  config_.groups_per_step = 2;
  {
    auto c = Open();
    ASSERT_TRUE(c->Submit(Request(10)).ok());
    const std::string actor = c->RegisterActor("a")->actor_id();
    auto leased = c->Lease(LeaseOf(actor, 5));
    ASSERT_EQ(leased->prompts_size(), 2);
    for (const auto& p : leased->prompts()) ASSERT_TRUE(c->Complete(Done(actor, p)).ok());
    EXPECT_EQ(c->Lease(LeaseOf(actor, 5))->prompts_size(), 0) << "both untrained";
  }
  auto c = Open();  // the restart
  const std::string actor = c->RegisterActor("a")->actor_id();
  auto leased = c->Lease(LeaseOf(actor, 5));
  ASSERT_EQ(leased->prompts_size(), 2) << "a restarted coordinator must not stall the run";
  ASSERT_TRUE(c->Complete(Done(actor, leased->prompts(0))).ok());
  ASSERT_TRUE(c->LearnerProgress(1, 2, /*groups_waiting=*/1).ok());
  EXPECT_EQ(c->Stats().groups_unconsumed, 1);
  EXPECT_EQ(c->Lease(LeaseOf(actor, 5))->prompts_size(), 0) << "1 waiting + 1 in flight";
}

}  // namespace
}  // namespace prl::coordinator
