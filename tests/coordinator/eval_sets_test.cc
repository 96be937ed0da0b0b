// Evaluation sets through the coordinator (SubmitPromptSetRequest.eval; coordinator/
// eval_rounds.h): a round at submission and again every N learner versions, each round's mean
// reward and pass@k in the set's status, leases marked eval, outside the lag budget and within
// the actor's evaluation share, rounds that survive a restart and a compaction, and bad specs
// refused naming the field.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tests/coordinator/coordinator_fixture.h"
#include "tests/status_testing.h"

namespace prl::coordinator {
namespace {

using ::prl::testing::IsError;

class EvalSetsTest : public CoordinatorTest {
 protected:
  static v1::SubmitPromptSetRequest Eval(int prompts, int every, int samples = 2) {
    v1::SubmitPromptSetRequest r = Request(prompts, samples);
    r.set_name("held-out");
    r.mutable_eval()->set_every_versions(every);
    return r;
  }
  static v1::ActorCapacity Slots(int32_t slots) {
    v1::ActorCapacity c;
    c.set_max_prompts_in_flight(slots);
    return c;
  }
  // Completes the leased prompt with one passing sample (reward 1) when `pass`, else none.
  static v1::CompleteRequest Scored(const std::string& actor, const v1::LeasedPrompt& p,
                                    bool pass) {
    v1::CompleteRequest c = Done(actor, p, 0.0);
    if (pass) c.mutable_result()->set_rewards(0, 1.0);
    return c;
  }
  static std::vector<v1::LeasedPrompt> Leased(Coordinator& c, const std::string& actor, int n,
                                              bool eval) {
    std::vector<v1::LeasedPrompt> out;
    absl::StatusOr<v1::LeaseResponse> r = c.Lease(LeaseOf(actor, n));
    EXPECT_TRUE(r.ok()) << r.status();
    for (const v1::LeasedPrompt& p : r->prompts()) {
      if (p.eval() == eval) out.push_back(p);
    }
    return out;
  }
};

// A round runs at submission (version 0) and once the learner reaches version 2 (every 2); its
// result is the mean reward over the samples and pass@2 over the prompts; eval leases never
// take the training budget (max_lag 0, 2 groups per step: 2 training prompts at a time).
TEST_F(EvalSetsTest, RoundsRunAtSubmissionAndEveryNVersionsOutsideTheLagBudget) {
  config_.groups_per_step = 2;
  config_.max_lag = 0;
  auto c = Open();
  const std::string train = c->Submit(Request(20))->prompt_set_id();
  const std::string eval = c->Submit(Eval(3, 2))->prompt_set_id();
  const std::string actor = c->RegisterActor("a", Slots(8))->actor_id();
  absl::StatusOr<v1::LeaseResponse> first = c->Lease(LeaseOf(actor, 8));
  ASSERT_TRUE(first.ok());
  int evals = 0, trains = 0;
  std::vector<v1::LeasedPrompt> eval_leases;
  for (const v1::LeasedPrompt& p : first->prompts()) {
    EXPECT_EQ(p.eval(), p.prompt_set_id() == eval);
    (p.eval() ? evals : trains) += 1;
    if (p.eval()) eval_leases.push_back(p);
  }
  EXPECT_EQ(trains, 2) << "the training budget: (max_lag + 1) x groups_per_step";
  EXPECT_EQ(evals, 2) << "the evaluation share: 0.25 x 8 slots";
  // The evaluation groups complete; the training budget is still full (they are not trained).
  ASSERT_TRUE(c->Complete(Scored(actor, eval_leases[0], true)).ok());
  ASSERT_TRUE(c->Complete(Scored(actor, eval_leases[1], false)).ok());
  absl::StatusOr<v1::LeaseResponse> second = c->Lease(LeaseOf(actor, 8));
  ASSERT_TRUE(second.ok());
  ASSERT_EQ(second->prompts_size(), 1) << "no training prompt, the last evaluation one";
  std::vector<v1::LeasedPrompt> last = {second->prompts(0)};
  ASSERT_TRUE(last[0].eval());
  ASSERT_TRUE(c->Complete(Scored(actor, last[0], true)).ok());
  v1::PromptSetStatus status = *c->Get(eval);
  EXPECT_TRUE(status.eval());
  EXPECT_EQ(status.state(), v1::PROMPT_SET_STATE_RUNNING) << "runs on between rounds";
  ASSERT_EQ(status.eval_rounds_size(), 1);
  const v1::EvalRoundResult& r0 = status.eval_rounds(0);
  EXPECT_EQ(r0.version(), 0);
  EXPECT_EQ(r0.prompts(), 3);
  EXPECT_EQ(r0.samples(), 6);
  EXPECT_EQ(r0.k(), 2);
  EXPECT_DOUBLE_EQ(r0.mean_reward(), 2.0 / 6);
  EXPECT_DOUBLE_EQ(r0.pass_at_k(), 2.0 / 3);
  EXPECT_EQ(status.eval_round_version(), -1);
  EXPECT_EQ(c->Stats().groups_completed, 0) << "evaluation groups are not training groups";
  EXPECT_EQ(c->Stats().eval_groups, 3);
  // Version 1: not due. Version 2: the next round, every prompt pending again.
  ASSERT_TRUE(c->LearnerProgress(1, 0).ok());
  EXPECT_EQ(c->Get(eval)->prompts_pending(), 0);
  ASSERT_TRUE(c->LearnerProgress(2, 0).ok());
  status = *c->Get(eval);
  EXPECT_EQ(status.eval_round_version(), 2);
  EXPECT_EQ(status.prompts_pending(), 3);
  EXPECT_EQ(status.prompts_done(), 0);
  const std::vector<v1::LeasedPrompt> again = Leased(*c, actor, 8, /*eval=*/true);
  EXPECT_EQ(again.size(), 2u) << "the share again (the training leases do not count)";
  (void)train;
}

TEST_F(EvalSetsTest, AnActorHoldsAtMostItsEvaluationShare) {
  auto c = Open();
  ASSERT_TRUE(c->Submit(Eval(20, 1)).ok());
  const std::string big = c->RegisterActor("big", Slots(10))->actor_id();
  const std::string small = c->RegisterActor("small", Slots(2))->actor_id();
  const std::string unsaid = c->RegisterActor("unsaid")->actor_id();
  const std::vector<v1::LeasedPrompt> held = Leased(*c, big, 10, true);
  EXPECT_EQ(held.size(), 2u);  // floor(0.25 x 10)
  EXPECT_TRUE(Leased(*c, big, 10, true).empty()) << "it holds its share";
  ASSERT_TRUE(c->Complete(Scored(big, held[0], true)).ok());
  EXPECT_EQ(Leased(*c, big, 10, true).size(), 1u);
  EXPECT_EQ(Leased(*c, small, 2, true).size(), 1u);   // at least one
  EXPECT_EQ(Leased(*c, unsaid, 8, true).size(), 1u);  // no slots declared: one
}

TEST_F(EvalSetsTest, TheEvaluationShareIsASetting) {
  config_.eval_max_actor_share = 1.0;
  auto c = Open();
  ASSERT_TRUE(c->Submit(Eval(20, 1)).ok());
  const std::string whole = c->RegisterActor("whole", Slots(4))->actor_id();
  EXPECT_EQ(Leased(*c, whole, 4, true).size(), 4u);
}

class EvalRestartTest : public EvalSetsTest, public ::testing::WithParamInterface<bool> {};

// The finished rounds and the running one survive a restart, over a compacted log too.
TEST_P(EvalRestartTest, RoundsSurviveARestart) {
  const bool compacted = GetParam();
  {
    const int64_t compact_bytes = compacted ? 4096 : int64_t{1} << 30;
    config_.compact_log_bytes = compact_bytes;
    std::string eval;
    std::vector<v1::EvalRoundResult> before;
    {
      auto c = Open();
      eval = c->Submit(Eval(4, 3, 1))->prompt_set_id();
      const std::string actor = c->RegisterActor("a", Slots(16))->actor_id();
      for (int64_t version = 0; version <= 9; version += 3) {
        ASSERT_TRUE(c->LearnerProgress(version, 0).ok());
        for (int k = 0; k < 4; ++k) {  // a round of 4 prompts, leased one at a time
          const std::vector<v1::LeasedPrompt> p = Leased(*c, actor, 1, true);
          ASSERT_EQ(p.size(), 1u) << "version " << version;
          ASSERT_TRUE(c->Complete(Scored(actor, p[0], k < version / 3)).ok());
        }
        // Many small sets, cancelled (never leased): the log grows past compaction's threshold.
        for (int i = 0; i < 30; ++i) {
          ASSERT_TRUE(c->Cancel(c->Submit(Request(1))->prompt_set_id()).ok());
        }
      }
      ASSERT_TRUE(c->LearnerProgress(12, 0).ok());  // a fifth round: 1 of 4 done
      const std::vector<v1::LeasedPrompt> p = Leased(*c, actor, 1, true);
      ASSERT_EQ(p.size(), 1u);
      ASSERT_TRUE(c->Complete(Scored(actor, p[0], true)).ok());
      const v1::PromptSetStatus status = *c->Get(eval);
      before.assign(status.eval_rounds().begin(), status.eval_rounds().end());
      ASSERT_EQ(before.size(), 4u);
      EXPECT_DOUBLE_EQ(before[3].pass_at_k(), 0.75);  // version 9: 3 of 4 pass
      if (compacted) EXPECT_GT(c->Stats().log_compactions, 0);
    }
    auto c = Open();
    const v1::PromptSetStatus status = *c->Get(eval);
    ASSERT_EQ(status.eval_rounds_size(), 4);
    for (int i = 0; i < 4; ++i) {
      EXPECT_EQ(status.eval_rounds(i).version(), before[i].version());
      EXPECT_DOUBLE_EQ(status.eval_rounds(i).pass_at_k(), before[i].pass_at_k());
      EXPECT_DOUBLE_EQ(status.eval_rounds(i).mean_reward(), before[i].mean_reward());
    }
    EXPECT_EQ(status.eval_round_version(), 12);
    EXPECT_EQ(status.prompts_done(), 1);
    EXPECT_EQ(status.prompts_pending(), 3);
  }
}

INSTANTIATE_TEST_SUITE_P(Logs, EvalRestartTest, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& i) {
                           return i.param ? "Compacted" : "Whole";
                         });

// The finished rounds are in the set's status, not in each status a watcher's events carry (one
// per completed group: a copy of the history in each would grow with the square of the rounds).
TEST_F(EvalSetsTest, WatchersSeeEachGroupButTheHistoryOnlyInTheStatus) {
  auto c = Open();
  const std::string eval = c->Submit(Eval(2, 1, 1))->prompt_set_id();
  const std::string actor = c->RegisterActor("a", Slots(8))->actor_id();
  size_t cursor = 0;
  bool finished = false;
  ASSERT_TRUE(c->WatchEvents(eval, &cursor, absl::ZeroDuration(), &finished).ok());
  for (int64_t version = 1; version <= 3; ++version) {  // rounds at 0, 1, 2 finish
    for (const v1::LeasedPrompt& p : Leased(*c, actor, 8, true)) {
      ASSERT_TRUE(c->Complete(Scored(actor, p, true)).ok());
    }
    ASSERT_TRUE(c->LearnerProgress(version, 0).ok());
  }
  EXPECT_EQ(c->Get(eval)->eval_rounds_size(), 3);
  const absl::StatusOr<std::vector<v1::PromptSetEvent>> events =
      c->WatchEvents(eval, &cursor, absl::ZeroDuration(), &finished);
  ASSERT_TRUE(events.ok()) << events.status();
  int groups = 0, statuses = 0;
  for (const v1::PromptSetEvent& e : *events) {
    groups += e.has_group() ? 1 : 0;
    if (!e.has_status()) continue;
    ++statuses;
    EXPECT_EQ(e.status().eval_rounds_size(), 0);
    EXPECT_TRUE(e.status().eval());
  }
  EXPECT_EQ(groups, 6);
  EXPECT_GE(statuses, 6);
}

TEST_F(EvalSetsTest, ACancelledEvaluationSetOpensNoMoreRounds) {
  auto c = Open();
  const std::string eval = c->Submit(Eval(1, 1, 1))->prompt_set_id();
  const std::string actor = c->RegisterActor("a", Slots(4))->actor_id();
  const std::vector<v1::LeasedPrompt> p = Leased(*c, actor, 1, true);
  ASSERT_EQ(p.size(), 1u);
  ASSERT_TRUE(c->Complete(Scored(actor, p[0], true)).ok());
  ASSERT_TRUE(c->Cancel(eval).ok());
  ASSERT_TRUE(c->LearnerProgress(5, 0).ok());
  const v1::PromptSetStatus status = *c->Get(eval);
  EXPECT_EQ(status.state(), v1::PROMPT_SET_STATE_CANCELLED);
  EXPECT_EQ(status.eval_rounds_size(), 1);
  EXPECT_EQ(status.prompts_pending(), 0);
}

TEST_F(EvalSetsTest, ABadEvaluationSpecIsRefusedNamingTheField) {
  auto c = Open();
  v1::SubmitPromptSetRequest r = Eval(1, -1);
  EXPECT_TRUE(IsError(c->Submit(r).status(), absl::StatusCode::kInvalidArgument,
                      {"eval.every_versions", "0 (a training set) or 1 to 1000000", "-1"}));
  r = Eval(1, 1);
  r.mutable_eval()->set_pass_reward(std::numeric_limits<double>::infinity());
  EXPECT_TRUE(IsError(c->Submit(r).status(), absl::StatusCode::kInvalidArgument,
                      {"eval.pass_reward", "a finite number"}));
}

}  // namespace
}  // namespace prl::coordinator
