// ReopenPrompts: completed prompts the learner will not train on (their groups were too
// stale) are pending again, as stale re-runs with the learner's reason; the change is durable
// across a restart and a compaction; other prompts are left alone; a hand-back is not a failed
// attempt, a re-run's lease asks for the learner's newest weights, and after max_stale_reruns
// a handed-back prompt is failed with a reason naming the knobs.
#include <gtest/gtest.h>


#include "absl/strings/str_cat.h"
#include "coordinator/coordinator.h"
#include "tests/coordinator/coordinator_testing.h"

namespace prl::coordinator {
namespace {

namespace v1 = prl::v1;

class ReopenTest : public CoordinatorLogTest {
 protected:
  // A set of `prompts` prompts, every one leased to one actor and completed.
  std::string SubmitAndComplete(Coordinator& c, int prompts) {
    const std::string id = c.Submit(Prompts(prompts, 1))->prompt_set_id();
    CompleteLeased(c, prompts);
    return id;
  }
  // `prompts` one-token prompts (ids first_id, first_id + 1, ...), 2 samples each.
  static v1::SubmitPromptSetRequest Prompts(int prompts, int32_t first_id) {
    v1::SubmitPromptSetRequest r;
    for (int i = 0; i < prompts; ++i) r.add_prompts()->mutable_tokens()->add_ids(first_id + i);
    r.set_samples_per_prompt(2);
    r.mutable_sampling()->set_temperature(1.0f);
    r.mutable_sampling()->set_top_p(1.0f);
    r.mutable_sampling()->set_max_tokens(4);
    r.mutable_reward()->set_name("exact_match");
    return r;
  }
  void CompleteLeased(Coordinator& c, int n) {
    const std::string actor_ = c.RegisterActor("a")->actor_id();
    const v1::LeaseResponse leased = *c.Lease(LeaseOf(actor_, n));
    ASSERT_EQ(leased.prompts_size(), n);
    for (const v1::LeasedPrompt& p : leased.prompts()) {
      v1::CompleteRequest done;
      done.set_actor_id(actor_);
      done.set_lease_id(p.lease_id());
      done.mutable_result()->set_prompt_index(p.prompt_index());
      for (int i = 0; i < p.samples(); ++i) {
        done.mutable_result()->add_rewards(1.0);
        done.mutable_result()->add_completion_tokens(3);
      }
      ASSERT_TRUE(c.Complete(done).ok());
    }
  }
  static v1::ReopenPromptsRequest Request(const std::string& set, std::vector<int> indices) {
    v1::ReopenPromptsRequest r;
    for (int i : indices) {
      v1::ReopenPromptsRequest::Prompt* p = r.add_prompts();
      p->set_prompt_set_id(set);
      p->set_prompt_index(i);
      p->set_reason("stale: 5 versions behind");
    }
    return r;
  }

};

TEST_F(ReopenTest, ACompletedPromptHandedBackIsPendingAgainAndSurvivesRestartAndCompaction) {
  for (int64_t compact : {int64_t{1} << 30, int64_t{1}}) {  // the log as is, or a snapshot
    SCOPED_TRACE(absl::StrCat("compact_log_bytes ", compact));
    TearDown();
    SetUp();
    config_.compact_log_bytes = compact;
    std::string id;
    {
      auto c = Open();
      id = SubmitAndComplete(*c, 3);
      ASSERT_EQ(c->Get(id)->state(), v1::PROMPT_SET_STATE_DONE);
      auto reopened = c->Reopen(Request(id, {1}));
      ASSERT_TRUE(reopened.ok()) << reopened.status();
      EXPECT_EQ(reopened->reopened(), 1);
      const v1::PromptSetStatus s = *c->Get(id);
      EXPECT_EQ(s.state(), v1::PROMPT_SET_STATE_RUNNING) << "the set is not done any more";
      EXPECT_EQ(s.prompts_done(), 2);
      EXPECT_EQ(s.prompts_pending(), 1);
      EXPECT_EQ(c->Stats().prompts_reopened, 1);
      EXPECT_EQ(c->Stats().log_compactions > 0, compact == 1);
    }
    auto c = Open();  // restarted: the log (or its snapshot) replayed
    const v1::PromptSetStatus s = *c->Get(id);
    EXPECT_EQ(s.prompts_done(), 2);
    EXPECT_EQ(s.prompts_pending(), 1);
    EXPECT_EQ(s.state(), v1::PROMPT_SET_STATE_RUNNING);
    CompleteLeased(*c, 1);  // generated again
    EXPECT_EQ(c->Get(id)->state(), v1::PROMPT_SET_STATE_DONE);
    EXPECT_EQ(c->Get(id)->prompts_done(), 3);
  }
}

// A handed-back group leaves the learner's backlog: with the lag budget full of completed
// groups, each reopened prompt frees one lease at once, before the learner reports again.
TEST_F(ReopenTest, AHandedBackGroupFreesItsPlaceInTheLagBudget) {
  config_.groups_per_step = 1;
  config_.max_lag = 1;  // a budget of 2 groups
  auto c = Open();
  const std::string id = SubmitAndComplete(*c, 2);
  ASSERT_TRUE(c->Submit(Prompts(1, 5)).ok());
  const v1::LeaseRequest lease = LeaseOf(c->RegisterActor("b")->actor_id(), 4);
  EXPECT_EQ(c->Lease(lease)->prompts_size(), 0) << "two completed groups fill the budget";
  ASSERT_EQ(c->Reopen(Request(id, {0}))->reopened(), 1);
  EXPECT_EQ(c->Lease(lease)->prompts_size(), 1) << "one place freed";
}

TEST_F(ReopenTest, PendingAndUnknownPromptsAreLeftAlone) {
  auto c = Open();
  const std::string id = SubmitAndComplete(*c, 1);
  v1::ReopenPromptsRequest r = Request(id, {0, 7});
  r.add_prompts()->set_prompt_set_id("no-such-set");
  ASSERT_EQ(c->Reopen(r)->reopened(), 1) << "prompt 0 only";
  EXPECT_EQ(c->Reopen(Request(id, {0}))->reopened(), 0) << "pending already";
}

// The learner can see a group before its actor's Complete reaches the coordinator: the lease
// ends there and then, the late Complete is refused, and the prompt runs again.
TEST_F(ReopenTest, ALeasedPromptHandedBackEndsItsLeaseAndItsLateCompleteIsRefused) {
  auto c = Open();
  const std::string id = c->Submit(Prompts(1, 1))->prompt_set_id();
  const std::string actor = c->RegisterActor("a")->actor_id();
  const v1::LeasedPrompt leased = c->Lease(LeaseOf(actor, 1))->prompts(0);
  ASSERT_EQ(c->Reopen(Request(id, {0}))->reopened(), 1);
  EXPECT_EQ(c->Get(id)->prompts_pending(), 1);
  v1::CompleteRequest late;
  late.set_actor_id(actor);
  late.set_lease_id(leased.lease_id());
  late.mutable_result()->set_prompt_index(0);
  for (int i = 0; i < 2; ++i) {
    late.mutable_result()->add_rewards(1.0);
    late.mutable_result()->add_completion_tokens(3);
  }
  EXPECT_EQ(c->Complete(late).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(c->Get(id)->prompts_done(), 0);
  CompleteLeased(*c, 1);  // the prompt's next attempt
  EXPECT_EQ(c->Get(id)->prompts_done(), 1);
}

// Staleness is the pipeline's doing: a prompt handed back more often than max_attempts is
// re-run all the same, and a real failed attempt afterwards still counts as the first.
TEST_F(ReopenTest, AHandBackIsAStaleRerunNotAFailedAttempt) {
  config_.max_attempts = 1;
  auto c = Open();
  const std::string id = SubmitAndComplete(*c, 1);
  for (int i = 0; i < 3; ++i) {
    ASSERT_EQ(c->Reopen(Request(id, {0}))->reopened(), 1);
    EXPECT_EQ(c->Get(id)->prompts_failed(), 0) << "hand-back " << i + 1;
    CompleteLeased(*c, 1);
  }
  const v1::PromptSetStatus s = *c->Get(id);
  EXPECT_EQ(s.state(), v1::PROMPT_SET_STATE_DONE);
  EXPECT_EQ(s.prompts_done(), 1);
  EXPECT_EQ(c->Stats().prompts_reopened, 3);
}

TEST_F(ReopenTest, AReRunsLeaseAsksForTheLearnersNewestWeights) {
  auto c = Open();
  const std::string id = SubmitAndComplete(*c, 2);
  ASSERT_TRUE(c->LearnerProgress(7, 2, 0).ok());
  ASSERT_EQ(c->Reopen(Request(id, {1}))->reopened(), 1);
  ASSERT_TRUE(c->Submit(Prompts(1, 9)).ok());
  const v1::LeaseRequest lease = LeaseOf(c->RegisterActor("b")->actor_id(), 1);
  const v1::LeaseResponse rerun = *c->Lease(lease);  // re-queued at the front
  ASSERT_EQ(rerun.prompts_size(), 1);
  EXPECT_EQ(rerun.prompts(0).prompt_index(), 1);
  EXPECT_EQ(rerun.min_weight_version(), 7);
  const v1::LeaseResponse first_run = *c->Lease(lease);
  ASSERT_EQ(first_run.prompts_size(), 1);
  EXPECT_NE(first_run.prompts(0).prompt_set_id(), id);
  EXPECT_EQ(first_run.min_weight_version(), 0) << "pipeline mode: no wait for a first run";
}

TEST_F(ReopenTest, AfterMaxStaleRerunsAPromptIsFailedWithAReasonNamingTheKnobsDurably) {
  for (int64_t compact : {int64_t{1} << 30, int64_t{1}}) {  // the log as is, or a snapshot
    SCOPED_TRACE(absl::StrCat("compact_log_bytes ", compact));
    TearDown();
    SetUp();
    config_.compact_log_bytes = compact;
    config_.max_attempts = 1;
    config_.max_stale_reruns = 2;
    std::string id;
    {
      auto c = Open();
      id = SubmitAndComplete(*c, 1);
      ASSERT_EQ(c->Reopen(Request(id, {0}))->reopened(), 1);
    }
    auto c = Open();  // the count survives a restart (and a compaction)
    CompleteLeased(*c, 1);
    ASSERT_EQ(c->Reopen(Request(id, {0}))->reopened(), 1);
    for (int restarted = 0; restarted < 2; ++restarted) {
      if (restarted) {
        c.reset();
        c = Open();
      }
      const v1::PromptSetStatus s = *c->Get(id);
      EXPECT_EQ(s.state(), v1::PROMPT_SET_STATE_DONE);
      EXPECT_EQ(s.prompts_failed(), 1);
      ASSERT_EQ(s.failed_prompts_size(), 1);
      EXPECT_EQ(s.failed_prompts(0).attempts(), 0);
      EXPECT_EQ(s.failed_prompts(0).stale_reruns(), 2);
      EXPECT_EQ(s.failed_prompts(0).reason(),
                "handed back by the learner: stale: 5 versions behind [handed back 2 times "
                "(coordinator.max_stale_reruns 2): its rollouts outlast learner.max_lag steps; "
                "raise learner.max_lag or lower sampling.max_tokens]");
    }
  }
}

}  // namespace
}  // namespace prl::coordinator
