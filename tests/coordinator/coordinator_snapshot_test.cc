// The coordinator's bounded, durable state: log compaction, retention of finished sets, group
// commit and the exclusive log (coordinator/coordinator_snapshot.cc, coordinator/prompt_log.h).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <thread>

#include "absl/strings/str_cat.h"
#include "coordinator/coordinator.h"
#include "tests/coordinator/coordinator_testing.h"
#include "tests/status_testing.h"

namespace prl::coordinator {
namespace {

namespace v1 = prl::v1;
using ::prl::testing::IsError;

class CoordinatorSnapshotTest : public CoordinatorLogTest {
 protected:
  int64_t LogBytes() const {
    return static_cast<int64_t>(std::filesystem::file_size(config_.log_path));
  }

  static v1::SubmitPromptSetRequest Request(int prompts, const std::string& key = "") {
    v1::SubmitPromptSetRequest r;
    r.set_name("snapshot");
    r.set_idempotency_key(key);
    for (int i = 0; i < prompts; ++i) {
      v1::Prompt* p = r.add_prompts();
      p->mutable_tokens()->add_ids(1 + i % 40);
      p->mutable_tokens()->add_ids(2);
    }
    r.set_samples_per_prompt(2);
    r.mutable_sampling()->set_temperature(1.0f);
    r.mutable_sampling()->set_top_p(1.0f);
    r.mutable_sampling()->set_max_tokens(8);
    r.mutable_reward()->set_name("exact_match");
    return r;
  }
  // Leases up to n prompts for `actor` and completes them with reward `reward`.
  static void CompleteSome(Coordinator& c, const std::string& actor, int n, double reward = 1) {
    v1::LeaseRequest lease;
    lease.set_actor_id(actor);
    lease.set_max_prompts(n);
    auto leased = c.Lease(lease);
    ASSERT_TRUE(leased.ok()) << leased.status();
    for (const v1::LeasedPrompt& p : leased->prompts()) {
      v1::CompleteRequest done;
      done.set_actor_id(actor);
      done.set_lease_id(p.lease_id());
      done.mutable_result()->set_prompt_index(p.prompt_index());
      for (int i = 0; i < p.samples(); ++i) {
        done.mutable_result()->add_rewards(reward);
        done.mutable_result()->add_completion_tokens(3);
      }
      auto r = c.Complete(done);
      ASSERT_TRUE(r.ok()) << r.status();
    }
  }
  static std::string Describe(const std::vector<v1::PromptSetStatus>& sets) {
    std::string out;
    for (const v1::PromptSetStatus& s : sets) {
      absl::StrAppend(&out, s.prompt_set_id(), " state ", s.state(), " done ", s.prompts_done(),
                      " pending ", s.prompts_pending(), " reward ", s.mean_reward(), "; ");
    }
    return out;
  }
};

TEST_F(CoordinatorSnapshotTest, ACompactedLogReplaysToTheSameState) {
  config_.compact_log_bytes = 4096;
  std::string done_key_id, cancelled_id;
  std::string before;
  {
    auto c = Open();
    const std::string actor = c->RegisterActor("a")->actor_id();
    done_key_id = c->Submit(Request(3, "key-1"))->prompt_set_id();
    CompleteSome(*c, actor, 3, 0.5);  // the first set is done
    cancelled_id = c->Submit(Request(4))->prompt_set_id();
    CompleteSome(*c, actor, 1, 0.5);  // 1 of the second
    ASSERT_TRUE(c->Cancel(cancelled_id).ok());
    // Many small sets come and finish: the log would grow without bound.
    for (int i = 0; i < 200; ++i) {
      ASSERT_TRUE(c->Submit(Request(2)).ok());
      CompleteSome(*c, actor, 2, i % 2);
    }
    ASSERT_TRUE(c->Submit(Request(5)).ok());
    CompleteSome(*c, actor, 2);  // a running set, 2 of 5 done
    EXPECT_GT(c->Stats().log_compactions, 0);
    before = Describe(c->List());
  }
  auto c = Open();
  EXPECT_EQ(Describe(c->List()), before);
  EXPECT_EQ(c->Get(cancelled_id)->state(), v1::PROMPT_SET_STATE_CANCELLED);
  auto again = c->Submit(Request(3, "key-1"));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(again->duplicate()) << "idempotency keys survive the snapshot";
  EXPECT_EQ(again->prompt_set_id(), done_key_id);
  // The running set's 3 remaining prompts, and nothing of the cancelled one, are leased.
  v1::LeaseRequest lease;
  lease.set_actor_id(c->RegisterActor("b")->actor_id());
  lease.set_max_prompts(100);
  EXPECT_EQ(c->Lease(lease)->prompts_size(), 3);
}

TEST_F(CoordinatorSnapshotTest, RetiredSetsLeaveTheNextSnapshotSoTheLogShrinks) {
  config_.compact_log_bytes = int64_t{1} << 30;  // no compaction while the sets accumulate
  {
    auto c = Open();
    const std::string actor = c->RegisterActor("a")->actor_id();
    for (int i = 0; i < 100; ++i) {
      ASSERT_TRUE(c->Submit(Request(10)).ok());
      CompleteSome(*c, actor, 10);
    }
  }
  const int64_t grown = LogBytes();
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  config_.compact_log_bytes = 4096;
  config_.retention_s = 1;
  auto c = Open();
  EXPECT_EQ(c->List().size(), 100u);
  c->ExpireLeases();  // every set finished over a second ago
  EXPECT_EQ(c->List().size(), 0u);
  // The learner hears of every retired set with its next progress reply (its ledger forgets
  // their prompts).
  const absl::StatusOr<v1::LearnerProgressResponse> progress = c->LearnerProgress(0, 0, 0);
  ASSERT_TRUE(progress.ok()) << progress.status();
  EXPECT_EQ(progress->retired_prompt_sets_size(), 100);
  EXPECT_EQ(progress->sets_retired(), 100);
  // A report echoing that reply hears of none again: each retired set is told once.
  const absl::StatusOr<v1::LearnerProgressResponse> again = c->LearnerProgress(0, 0, 0, &*progress);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->retired_prompt_sets_size(), 0);
  const std::string id = c->Submit(Request(1))->prompt_set_id();  // the log is due: compacted
  EXPECT_EQ(c->Stats().log_compactions, 1);
  EXPECT_LT(LogBytes(), 1024) << "grown to " << grown << " bytes, only one live set is left";
  c.reset();
  c = Open();
  ASSERT_EQ(c->List().size(), 1u);
  EXPECT_EQ(c->List()[0].prompt_set_id(), id);
}

TEST_F(CoordinatorSnapshotTest, FinishedSetsAreKeptWithinTheRetentionTime) {
  config_.retention_s = 3600;
  auto c = Open();
  const std::string actor = c->RegisterActor("a")->actor_id();
  const std::string id = c->Submit(Request(2))->prompt_set_id();
  CompleteSome(*c, actor, 2);
  c->ExpireLeases();
  EXPECT_TRUE(c->Get(id).ok());
  EXPECT_EQ(c->Stats().sets_retired, 0);
}

TEST_F(CoordinatorSnapshotTest, SetsFinishedLongerAgoThanTheRetentionAreDropped) {
  config_.retention_s = 1;
  auto c = Open();
  const std::string actor = c->RegisterActor("a")->actor_id();
  const std::string done = c->Submit(Request(2, "done-key"))->prompt_set_id();
  CompleteSome(*c, actor, 2);
  const std::string cancelled = c->Submit(Request(3))->prompt_set_id();
  v1::LeaseRequest lease;
  lease.set_actor_id(actor);
  lease.set_max_prompts(1);
  auto in_flight = c->Lease(lease);  // a lease of the set about to be cancelled
  ASSERT_EQ(in_flight->prompts_size(), 1);
  ASSERT_TRUE(c->Cancel(cancelled).ok());
  const std::string running = c->Submit(Request(2))->prompt_set_id();
  c->ExpireLeases();  // starts the finished sets' clocks (if the records did not)
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  c->ExpireLeases();
  EXPECT_EQ(c->Get(done).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(c->Get(cancelled).status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(c->Get(running).ok());
  EXPECT_EQ(c->Stats().sets_retired, 2);
  ASSERT_EQ(c->List().size(), 1u);
  // The retired set's lease and queue entries went with it.
  v1::CompleteRequest late;
  late.set_actor_id(actor);
  late.set_lease_id(in_flight->prompts(0).lease_id());
  EXPECT_EQ(c->Complete(late).status().code(), absl::StatusCode::kNotFound);
  v1::HeartbeatRequest hb;
  hb.set_actor_id(actor);
  EXPECT_TRUE(c->Heartbeat(hb).ok());
  lease.set_max_prompts(10);
  EXPECT_EQ(c->Lease(lease)->prompts_size(), 2) << "only the running set's prompts";
  // A retired key is free again.
  auto resubmitted = c->Submit(Request(2, "done-key"));
  ASSERT_TRUE(resubmitted.ok());
  EXPECT_FALSE(resubmitted->duplicate());
  // Until the next snapshot the log still holds the retired sets: a restart replays them and
  // retires them again at once, by the time their records finished them.
  c.reset();
  c = Open();
  c->ExpireLeases();
  EXPECT_EQ(c->Get(done).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(c->List().size(), 2u);
}

TEST_F(CoordinatorSnapshotTest, ARestartKeepsTheRetentionClockOfFinishedSets) {
  config_.retention_s = 1;
  std::string id;
  {
    auto c = Open();
    id = c->Submit(Request(2))->prompt_set_id();
    CompleteSome(*c, c->RegisterActor("a")->actor_id(), 2);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  auto c = Open();
  ASSERT_TRUE(c->Get(id).ok()) << "replayed";
  c->ExpireLeases();
  EXPECT_EQ(c->Get(id).status().code(), absl::StatusCode::kNotFound)
      << "finished over a second ago by its log record, not by the restart";
}

TEST_F(CoordinatorSnapshotTest, ConcurrentCompletionsAreAllDurable) {
  constexpr int kThreads = 8, kEach = 25;
  std::string id;
  {
    auto c = Open();
    id = c->Submit(Request(kThreads * kEach))->prompt_set_id();
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&c, t] {
        const std::string actor = c->RegisterActor(absl::StrCat("a", t))->actor_id();
        for (int i = 0; i < kEach; ++i) CompleteSome(*c, actor, 1);
      });
    }
    for (std::thread& t : threads) t.join();
    EXPECT_EQ(c->Get(id)->state(), v1::PROMPT_SET_STATE_DONE);
  }
  auto c = Open();
  EXPECT_EQ(c->Get(id)->prompts_done(), kThreads * kEach);
}

TEST_F(CoordinatorSnapshotTest, WithoutGroupCommitCompletionsAreDurableToo) {
  config_.group_commit = false;
  std::string id;
  {
    auto c = Open();
    id = c->Submit(Request(4))->prompt_set_id();
    CompleteSome(*c, c->RegisterActor("a")->actor_id(), 4);
  }
  EXPECT_EQ(Open()->Get(id)->state(), v1::PROMPT_SET_STATE_DONE);
}

TEST_F(CoordinatorSnapshotTest, ASecondCoordinatorOnTheSameLogIsRefused) {
  auto first = Open();
  ASSERT_NE(first, nullptr);
  EXPECT_TRUE(IsError(Coordinator::Open(config_).status(), absl::StatusCode::kFailedPrecondition,
                      {config_.log_path, absl::StrCat("pid ", getpid())}));
}

}  // namespace
}  // namespace prl::coordinator
