// The coordinator's parts on their own: the lease table (coordinator/lease_table.h) and the
// prompt sets (coordinator/prompt_sets.h), driven without the coordinator, its log or mutex.
#include <gtest/gtest.h>

#include "absl/time/time.h"
#include "coordinator/ids.h"
#include "coordinator/lease_table.h"
#include "coordinator/prompt_sets.h"

namespace prl::coordinator {
namespace {

namespace v1 = prl::v1;

// Renewal moves only the listed leases' deadlines; the actor's other leases are reported as
// dropped (still open until the caller ends them); expiry reports exactly the leases past
// their deadline, and an ended lease is gone by id and by prompt.
TEST(LeaseTableTest, RenewalDropsUnlistedLeasesAndExpiryFindsOnlyThoseLate) {
  LeaseTable table(/*lease_ms=*/1000);
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  const std::string a0 = table.Open({"ps-a", 0}, "actor-1", t0);
  const std::string a1 = table.Open({"ps-a", 1}, "actor-1", t0);
  const std::string b0 = table.Open({"ps-b", 0}, "actor-2", t0);
  std::string set_id;
  int64_t index = -1;
  ASSERT_TRUE(ParseLeaseId(a1, &set_id, &index)) << "a lease id names its prompt";
  EXPECT_EQ(set_id, "ps-a");
  EXPECT_EQ(index, 1);
  EXPECT_EQ(*table.IdOf({"ps-b", 0}), b0);
  EXPECT_EQ(table.Holders().size(), 2u);

  const std::vector<PromptRef> dropped = table.Renew("actor-1", {a0}, t0 + absl::Seconds(0.9));
  ASSERT_EQ(dropped.size(), 1u);
  EXPECT_EQ(dropped[0].index, 1);
  EXPECT_NE(table.Find(a1), nullptr) << "dropped leases stay open until ended";
  EXPECT_TRUE(table.Expired(t0 + absl::Seconds(0.5)).empty()) << "nothing is late yet";

  const std::vector<PromptRef> late = table.Expired(t0 + absl::Seconds(1.5));
  ASSERT_EQ(late.size(), 2u) << "a1 and b0 were not renewed; a0 was, to 1.9 s";
  for (const PromptRef& p : late) table.End(p);
  EXPECT_EQ(table.Find(a1), nullptr);
  EXPECT_EQ(table.IdOf({"ps-b", 0}), nullptr);
  EXPECT_EQ(table.size(), 1);
  EXPECT_TRUE(table.Expired(t0 + absl::Seconds(1.8)).empty());
  EXPECT_EQ(table.Expired(t0 + absl::Seconds(2)).size(), 1u);
  table.EndSets([](const std::string& id) { return id == "ps-a"; });
  EXPECT_EQ(table.size(), 0);
}

v1::SubmittedPromptSet Submitted(const std::string& id, int prompts, const std::string& key) {
  v1::SubmittedPromptSet s;
  s.set_prompt_set_id(id);
  s.mutable_request()->set_samples_per_prompt(2);
  s.mutable_request()->set_idempotency_key(key);
  s.mutable_request()->mutable_sampling()->set_max_tokens(8);
  for (int i = 0; i < prompts; ++i) {
    s.mutable_request()->add_prompts()->mutable_tokens()->add_ids(i + 1);
  }
  return s;
}

v1::GroupResult Group(int64_t index, double reward) {
  v1::GroupResult g;
  g.set_prompt_index(index);
  g.add_rewards(reward);
  g.add_rewards(reward);
  return g;
}

// The counts follow the records: a leased prompt's failed attempt re-queues it at the front, a
// failing one fails it, a completed one settles the set; a reopened completion un-does it; the
// snapshot replayed into fresh sets rebuilds the same counts and failures.
TEST(PromptSetsTest, RecordsMoveCountsAndTheSnapshotRebuildsThem) {
  PromptSets sets(/*max_text_bytes_per_set=*/1 << 20, [](const PromptSets::Set&) { return ""; });
  sets.ApplySubmitted(Submitted("ps-a", 3, "key-1"));
  ASSERT_NE(sets.ByIdempotencyKey("", "key-1"), nullptr);
  sets.MarkLeased("ps-a", 0);
  sets.MarkLeased("ps-a", 1);
  EXPECT_EQ(sets.PendingOrInFlight(), 3);
  v1::FailedAttempt attempt;
  attempt.set_prompt_set_id("ps-a");
  attempt.set_prompt_index(1);
  attempt.set_attempts(1);
  attempt.set_reason("lease expired");
  EXPECT_TRUE(sets.ApplyFailedAttempt(attempt)) << "a failed attempt is a re-run";
  EXPECT_EQ(sets.FindPrompt("ps-a", 1)->state, PromptSets::PromptState::kPending);

  attempt.set_attempts(2);
  attempt.set_failed(true);
  EXPECT_FALSE(sets.ApplyFailedAttempt(attempt));  // pending -> failed (max_attempts reached)
  sets.ApplyCompleted("ps-a", Group(0, 1.0));
  sets.ApplyCompleted("ps-a", Group(2, 0.0));
  const PromptSets::Set& set = *sets.Find("ps-a");
  EXPECT_EQ(set.state, v1::PROMPT_SET_STATE_DONE);
  EXPECT_EQ(set.done, 2);
  EXPECT_EQ(set.failed, 1);
  EXPECT_DOUBLE_EQ(sets.StatusOf(set).mean_reward(), 0.5);

  v1::FailedAttempt reopen;
  reopen.set_prompt_set_id("ps-a");
  reopen.set_prompt_index(2);
  reopen.set_stale_reruns(1);
  reopen.set_reopened(true);
  EXPECT_TRUE(sets.ApplyFailedAttempt(reopen)) << "a reopened prompt is a re-run";
  EXPECT_EQ(sets.Find("ps-a")->state, v1::PROMPT_SET_STATE_RUNNING);
  EXPECT_EQ(sets.counts().prompts_reopened, 1);

  PromptSets rebuilt(1 << 20, [](const PromptSets::Set&) { return ""; });
  for (const v1::LogRecord& r : sets.Snapshot()) {
    if (r.has_submitted()) rebuilt.ApplySubmitted(r.submitted());
    if (r.has_completed()) rebuilt.ApplyCompleted(r.completed().prompt_set_id(), r.completed().result());
    if (r.has_failed_attempt()) rebuilt.ApplyFailedAttempt(r.failed_attempt());
  }
  const PromptSets::Set& again = *rebuilt.Find("ps-a");
  EXPECT_EQ(again.done, 1);
  EXPECT_EQ(again.failed, 1);
  EXPECT_EQ(again.pending, 1);
  EXPECT_EQ(rebuilt.FindPrompt("ps-a", 2)->stale_reruns, 1);
  EXPECT_EQ(rebuilt.FindPrompt("ps-a", 1)->last_reason, "lease expired");
}

// Retirement drops a finished set after retention_s with its idempotency key, remembers its id,
// and never touches a running set.
TEST(PromptSetsTest, RetirementDropsFinishedSetsWithTheirKeysAfterRetention) {
  PromptSets sets(1 << 20, [](const PromptSets::Set&) { return ""; });
  sets.ApplySubmitted(Submitted("ps-a", 1, "key-a"));
  sets.ApplySubmitted(Submitted("ps-b", 1, "key-b"));
  sets.ApplyCompleted("ps-a", Group(0, 1.0));
  const absl::Time t0 = absl::FromUnixSeconds(5000);
  EXPECT_TRUE(sets.Retire(t0, /*retention_s=*/60).empty()) << "finished now: the clock starts";
  EXPECT_TRUE(sets.Retire(t0 + absl::Seconds(59), 60).empty());
  EXPECT_EQ(sets.Retire(t0 + absl::Seconds(60), 60), std::vector<std::string>{"ps-a"});
  EXPECT_EQ(sets.Find("ps-a"), nullptr);
  EXPECT_EQ(sets.ByIdempotencyKey("", "key-a"), nullptr);
  EXPECT_NE(sets.ByIdempotencyKey("", "key-b"), nullptr);
  EXPECT_EQ(sets.recently_retired().back(), "ps-a");
  EXPECT_EQ(sets.counts().sets_retired, 1);
  EXPECT_EQ(sets.order(), std::vector<std::string>{"ps-b"});
}

}  // namespace
}  // namespace prl::coordinator
