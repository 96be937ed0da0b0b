// The lease lifecycle: actor capacity, Release, and prompts failed after max_attempts, durable
// across a restart and a compaction (coordinator/capacity.h, coordinator/prompt_attempts.cc).
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <future>
#include <map>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "coordinator/coordinator.h"
#include "tests/coordinator/coordinator_testing.h"

namespace prl::coordinator {
namespace {

namespace v1 = prl::v1;

class LeaseLifecycleTest : public CoordinatorLogTest {
 protected:
  void SetUp() override {
    CoordinatorLogTest::SetUp();
    config_.max_samples_per_prompt = 256;
  }

  // `prompts` prompts of `prompt_tokens` tokens each, max_tokens 8.
  static v1::SubmitPromptSetRequest Request(int prompts, int samples, int prompt_tokens = 2) {
    v1::SubmitPromptSetRequest r;
    r.set_name("lifecycle");
    for (int i = 0; i < prompts; ++i) {
      v1::Prompt* p = r.add_prompts();
      for (int t = 0; t < prompt_tokens; ++t) p->mutable_tokens()->add_ids(1 + (i + t) % 40);
    }
    r.set_samples_per_prompt(samples);
    r.mutable_sampling()->set_temperature(1.0f);
    r.mutable_sampling()->set_top_p(1.0f);
    r.mutable_sampling()->set_max_tokens(8);
    r.mutable_reward()->set_name("exact_match");
    return r;
  }
  static v1::ActorCapacity Capacity(int32_t samples, int64_t tokens = 0) {
    v1::ActorCapacity c;
    c.set_max_samples_per_prompt(samples);
    c.set_max_tokens(tokens);
    return c;
  }
  static v1::LeaseResponse Lease(Coordinator& c, const std::string& actor, int n) {
    v1::LeaseRequest r;
    r.set_actor_id(actor);
    r.set_max_prompts(n);
    absl::StatusOr<v1::LeaseResponse> leased = c.Lease(r);
    EXPECT_TRUE(leased.ok()) << leased.status();
    return leased.ok() ? *leased : v1::LeaseResponse();
  }
  static absl::StatusOr<v1::ReleaseResponse> Release(Coordinator& c, const std::string& actor,
                                                     const std::string& lease,
                                                     const std::string& detail) {
    v1::ReleaseRequest r;
    r.set_actor_id(actor);
    r.set_lease_id(lease);
    r.set_reason(v1::RELEASE_REASON_ENGINE_REFUSED);
    r.set_detail(detail);
    return c.Release(r);
  }
  // Leases prompt `index`'s next attempt to `actor` and releases it; the response.
  static v1::ReleaseResponse LeaseAndRelease(Coordinator& c, const std::string& actor,
                                             const std::string& detail) {
    v1::LeaseResponse leased = Lease(c, actor, 1);
    EXPECT_EQ(leased.prompts_size(), 1);
    if (leased.prompts_size() != 1) return {};
    absl::StatusOr<v1::ReleaseResponse> released =
        Release(c, actor, leased.prompts(0).lease_id(), detail);
    EXPECT_TRUE(released.ok()) << released.status();
    return released.ok() ? *released : v1::ReleaseResponse();
  }
  // Fails prompt 0 of a one-prompt set: max_attempts releases. Returns the set id.
  std::string SubmitAndFailIt(Coordinator& c) {
    const std::string id = c.Submit(Request(1, 2))->prompt_set_id();
    const std::string actor = c.RegisterActor("a")->actor_id();
    for (int i = 1; i < config_.max_attempts; ++i) {
      EXPECT_FALSE(LeaseAndRelease(c, actor, absl::StrCat("try ", i)).prompt_failed());
    }
    EXPECT_TRUE(LeaseAndRelease(c, actor, "out of blocks").prompt_failed());
    return id;
  }
  static void ExpectFailedWithItsReason(const v1::PromptSetStatus& s, int attempts) {
    EXPECT_EQ(s.state(), v1::PROMPT_SET_STATE_DONE);
    EXPECT_EQ(s.prompts_failed(), 1);
    EXPECT_EQ(s.prompts_pending(), 0);
    ASSERT_EQ(s.failed_prompts_size(), 1);
    EXPECT_EQ(s.failed_prompts(0).prompt_index(), 0);
    EXPECT_EQ(s.failed_prompts(0).attempts(), attempts);
    EXPECT_NE(s.failed_prompts(0).reason().find("engine refused the group: out of blocks"),
              std::string::npos)
        << s.failed_prompts(0).reason();
  }
};

TEST_F(LeaseLifecycleTest, AnActorIsLeasedOnlyPromptsWithinItsCapacity) {
  auto c = Open();
  const std::string big = c->Submit(Request(2, 128))->prompt_set_id();
  const std::string small = c->Submit(Request(2, 4))->prompt_set_id();
  const std::string narrow = c->RegisterActor("narrow", Capacity(64))->actor_id();
  v1::LeaseResponse leased = Lease(*c, narrow, 8);
  ASSERT_EQ(leased.prompts_size(), 2);
  for (const v1::LeasedPrompt& p : leased.prompts()) EXPECT_EQ(p.prompt_set_id(), small);
  // The big set's prompts kept their place: an actor that can run them gets them, in turn
  // with a newer set (lease_scheduler.h).
  const std::string wide = c->RegisterActor("wide", Capacity(128))->actor_id();
  const std::string newer = c->Submit(Request(1, 4))->prompt_set_id();
  leased = Lease(*c, wide, 8);
  ASSERT_EQ(leased.prompts_size(), 3);
  std::map<std::string, int> of_set;
  for (const v1::LeasedPrompt& p : leased.prompts()) ++of_set[p.prompt_set_id()];
  EXPECT_EQ(of_set, (std::map<std::string, int>{{big, 2}, {newer, 1}}));
}

TEST_F(LeaseLifecycleTest, PromptsLongerThanAnActorsSequencesGoToAnActorThatHoldsThem) {
  auto c = Open();
  const std::string id = c->Submit(Request(1, 2, /*prompt_tokens=*/20))->prompt_set_id();
  const std::string short_actor = c->RegisterActor("short", Capacity(64, 16))->actor_id();
  EXPECT_EQ(Lease(*c, short_actor, 1).prompts_size(), 0);  // 20 + 8 tokens > 16
  const std::string long_actor = c->RegisterActor("long", Capacity(64, 28))->actor_id();
  v1::LeaseResponse leased = Lease(*c, long_actor, 1);
  ASSERT_EQ(leased.prompts_size(), 1);
  EXPECT_EQ(leased.prompts(0).prompt_set_id(), id);
}

// Within a set, prompts too long for an actor keep their place while the shorter ones after
// them are leased; each set's order is kept throughout.
TEST_F(LeaseLifecycleTest, ShortPromptsOfASetPassLongOnesAnActorCannotHold) {
  auto c = Open();
  v1::SubmitPromptSetRequest mixed = Request(4, 2, /*prompt_tokens=*/20);
  for (int i : {1, 3}) mixed.mutable_prompts(i)->mutable_tokens()->mutable_ids()->Truncate(2);
  const std::string id = c->Submit(mixed)->prompt_set_id();
  const std::string later = c->Submit(Request(1, 2))->prompt_set_id();
  const std::string short_actor = c->RegisterActor("short", Capacity(64, 16))->actor_id();
  v1::LeaseResponse leased = Lease(*c, short_actor, 8);
  std::map<std::string, std::vector<int64_t>> of_set;
  for (const v1::LeasedPrompt& p : leased.prompts()) {
    of_set[p.prompt_set_id()].push_back(p.prompt_index());
  }
  EXPECT_EQ(of_set, (std::map<std::string, std::vector<int64_t>>{{id, {1, 3}}, {later, {0}}}));
  const std::string long_actor = c->RegisterActor("long", Capacity(64, 28))->actor_id();
  leased = Lease(*c, long_actor, 8);
  ASSERT_EQ(leased.prompts_size(), 2);
  EXPECT_EQ(leased.prompts(0).prompt_index(), 0);
  EXPECT_EQ(leased.prompts(1).prompt_index(), 2);
}

TEST_F(LeaseLifecycleTest, ASetNoRegisteredActorCanRunSaysSo) {
  auto c = Open();
  const std::string id = c->Submit(Request(1, 128))->prompt_set_id();
  EXPECT_EQ(c->Get(id)->message(), "");  // no actor yet: nothing to say
  ASSERT_TRUE(c->RegisterActor("a", Capacity(64, 16)).ok());
  ASSERT_TRUE(c->RegisterActor("b", Capacity(32, 24)).ok());
  EXPECT_EQ(c->Get(id)->message(),
            "no registered actor can run samples_per_prompt 128 (largest: 64)");
  const std::string tokens = c->Submit(Request(1, 2, 20))->prompt_set_id();
  EXPECT_EQ(c->Get(tokens)->message(),
            "no registered actor can run 28 tokens per sequence (prompt + sampling.max_tokens; "
            "largest: 24)");
  ASSERT_TRUE(c->RegisterActor("d", Capacity(128)).ok());
  EXPECT_EQ(c->Get(id)->message(), "");
  EXPECT_EQ(c->Get(tokens)->message(), "");
}

TEST_F(LeaseLifecycleTest, ReleaseRequeuesAtOnceWithItsReasonAndOnlyFromTheHolder) {
  auto c = Open();
  const std::string id = c->Submit(Request(1, 2))->prompt_set_id();
  const std::string holder = c->RegisterActor("holder")->actor_id();
  const std::string other = c->RegisterActor("other")->actor_id();
  v1::LeaseResponse leased = Lease(*c, holder, 1);
  ASSERT_EQ(leased.prompts_size(), 1);
  const std::string lease = leased.prompts(0).lease_id();
  EXPECT_EQ(Release(*c, other, lease, "not mine").status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(Release(*c, holder, lease + "x", "wrong nonce").status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(c->Stats().rejected_releases, 2);
  EXPECT_EQ(c->Get(id)->prompts_in_flight(), 1);

  absl::StatusOr<v1::ReleaseResponse> released = Release(*c, holder, lease, "n = 2 > 1");
  ASSERT_TRUE(released.ok()) << released.status();
  EXPECT_FALSE(released->prompt_failed());
  EXPECT_EQ(c->Get(id)->prompts_pending(), 1);
  EXPECT_EQ(c->Stats().leases_released, 1);
  EXPECT_EQ(Release(*c, holder, lease, "twice").status().code(),
            absl::StatusCode::kFailedPrecondition);
  v1::LeaseResponse again = Lease(*c, other, 1);
  ASSERT_EQ(again.prompts_size(), 1);
  EXPECT_EQ(again.prompts(0).prompt_index(), 0);
}

TEST_F(LeaseLifecycleTest, AfterMaxAttemptsAPromptFailsVisiblyAndItsSetFinishes) {
  config_.max_attempts = 3;
  auto c = Open();
  const std::string id = c->Submit(Request(1, 2))->prompt_set_id();
  size_t cursor = 0;
  bool finished = false;
  ASSERT_TRUE(c->WatchEvents(id, &cursor, absl::ZeroDuration(), &finished).ok());
  const std::string actor = c->RegisterActor("a")->actor_id();
  EXPECT_FALSE(LeaseAndRelease(*c, actor, "first").prompt_failed());
  EXPECT_FALSE(LeaseAndRelease(*c, actor, "second").prompt_failed());
  EXPECT_TRUE(LeaseAndRelease(*c, actor, "out of blocks").prompt_failed());
  ExpectFailedWithItsReason(*c->Get(id), 3);
  EXPECT_EQ(Lease(*c, actor, 1).prompts_size(), 0);  // never leased again
  EXPECT_EQ(c->Stats().prompts_failed, 1);

  auto events = c->WatchEvents(id, &cursor, absl::Seconds(1), &finished);
  ASSERT_TRUE(events.ok()) << events.status();
  ASSERT_EQ(events->size(), 2u);
  ASSERT_TRUE((*events)[0].has_failed());
  EXPECT_EQ((*events)[0].failed().attempts(), 3);
  EXPECT_EQ((*events)[1].status().prompts_failed(), 1);
  EXPECT_TRUE(finished);
}

TEST_F(LeaseLifecycleTest, AReleasesLongDetailIsCutAndSaysSo) {
  config_.max_attempts = 1;
  auto c = Open();
  const std::string id = c->Submit(Request(1, 2))->prompt_set_id();
  const std::string actor = c->RegisterActor("a")->actor_id();
  EXPECT_TRUE(LeaseAndRelease(*c, actor, std::string(5000, 'x')).prompt_failed());
  const std::string reason = c->Get(id)->failed_prompts(0).reason();
  EXPECT_LT(reason.size(), 1200u) << "the logged reason is bounded";
  EXPECT_NE(reason.find("[detail cut at 1024 of 5000 bytes]"), std::string::npos) << reason;
}

TEST_F(LeaseLifecycleTest, ExpiryAndHeartbeatDropsCountAsFailedAttempts) {
  config_.max_attempts = 2;
  config_.lease_ms = 200;
  config_.heartbeat_ms = 50;
  auto c = Open();
  const std::string id = c->Submit(Request(1, 2))->prompt_set_id();
  const std::string actor = c->RegisterActor("a")->actor_id();
  ASSERT_EQ(Lease(*c, actor, 1).prompts_size(), 1);
  v1::HeartbeatRequest hb;
  hb.set_actor_id(actor);  // lists nothing: the lease was dropped
  ASSERT_TRUE(c->Heartbeat(hb).ok());
  EXPECT_EQ(c->Get(id)->prompts_pending(), 1);
  ASSERT_EQ(Lease(*c, actor, 1).prompts_size(), 1);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  c->ExpireLeases();
  const v1::PromptSetStatus s = *c->Get(id);
  EXPECT_EQ(s.state(), v1::PROMPT_SET_STATE_DONE);
  ASSERT_EQ(s.failed_prompts_size(), 1);
  EXPECT_EQ(s.failed_prompts(0).attempts(), 2);
  EXPECT_NE(s.failed_prompts(0).reason().find("lease expired"), std::string::npos)
      << s.failed_prompts(0).reason();
}

// Issue 28: a lease expiry waited for its record's fsync under the coordinator's mutex, so a
// slow disk stalled every RPC. The test holds the log's fsync and asks for a set's status
// meanwhile.
TEST_F(LeaseLifecycleTest, ALeaseExpiryDoesNotBlockOtherCallsWhileItsRecordIsSynced) {
  std::mutex m;
  std::condition_variable cv;
  bool hold = false, holding = false;
  config_.log_before_sync = [&] {
    std::unique_lock<std::mutex> lock(m);
    if (!hold) return;
    holding = true;
    cv.notify_all();
    cv.wait(lock, [&] { return !hold; });
  };
  config_.lease_ms = 2;
  config_.heartbeat_ms = 1;
  auto c = Open();
  const std::string id = c->Submit(Request(1, 2))->prompt_set_id();
  const std::string actor = c->RegisterActor("a")->actor_id();
  ASSERT_EQ(Lease(*c, actor, 1).prompts_size(), 1);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // past the 2 ms lease
  {
    std::lock_guard<std::mutex> lock(m);
    hold = true;
  }
  std::thread expiry([&] { c->ExpireLeases(); });  // logs the failed attempt, syncs it
  {
    std::unique_lock<std::mutex> lock(m);
    cv.wait(lock, [&] { return holding; });  // the expiry's fsync is held now
  }
  auto status = std::async(std::launch::async, [&] { return c->Get(id); });
  // A margin, not a timing: the call needs microseconds; without the fix it waits forever.
  const bool answered = status.wait_for(std::chrono::seconds(30)) == std::future_status::ready;
  {
    std::lock_guard<std::mutex> lock(m);
    hold = false;
  }
  cv.notify_all();
  expiry.join();
  ASSERT_TRUE(answered) << "the status call waited for the expiry's fsync";
  EXPECT_EQ(status.get()->prompts_pending(), 1) << "the expired prompt is pending again";
}

// Issue 28: a Submit (and a Cancel) waited for its fsync under the coordinator's mutex, so a
// large submission on a slow disk stalled every actor's lease. The test holds the submission's
// fsync and leases from an earlier set meanwhile; the submit returns only once it is durable.
TEST_F(LeaseLifecycleTest, ASubmitsFsyncDoesNotBlockLeasesOfOtherSets) {
  std::mutex m;
  std::condition_variable cv;
  bool hold = false, holding = false;
  config_.log_before_sync = [&] {
    std::unique_lock<std::mutex> lock(m);
    if (!hold) return;
    holding = true;
    cv.notify_all();
    cv.wait(lock, [&] { return !hold; });
  };
  auto c = Open();
  ASSERT_TRUE(c->Submit(Request(2, 2)).ok());
  const std::string actor = c->RegisterActor("a")->actor_id();
  {
    std::lock_guard<std::mutex> lock(m);
    hold = true;
  }
  auto submit = std::async(std::launch::async, [&] { return c->Submit(Request(3, 2)); });
  {
    std::unique_lock<std::mutex> lock(m);
    cv.wait(lock, [&] { return holding; });  // the submission's fsync is held now
  }
  auto lease = std::async(std::launch::async, [&] { return Lease(*c, actor, 1); });
  // A margin, not a timing: the call needs microseconds; without the fix it waits forever.
  const bool answered = lease.wait_for(std::chrono::seconds(30)) == std::future_status::ready;
  const bool submit_returned =
      submit.wait_for(std::chrono::milliseconds(0)) == std::future_status::ready;
  {
    std::lock_guard<std::mutex> lock(m);
    hold = false;
  }
  cv.notify_all();
  ASSERT_TRUE(answered) << "the lease waited for the submission's fsync";
  EXPECT_EQ(lease.get().prompts_size(), 1);
  EXPECT_FALSE(submit_returned) << "a submit is answered only once its set is durable";
  ASSERT_TRUE(submit.get().ok());
}

// Issue 28: the actor table never forgot an actor, and any holder of the actor token could
// grow it with Register. It is capped, and actors silent for 2 lease_ms that hold no lease are
// forgotten; an actor holding a lease is kept however quiet, until its lease expires.
TEST_F(LeaseLifecycleTest, TheActorTableIsBoundedAndForgetsSilentActors) {
  config_.max_actors = 3;
  config_.lease_ms = 200;  // silence: 400 ms; "later" below must not reach it during the test
  config_.heartbeat_ms = 50;
  auto c = Open();
  c->Submit(Request(1, 2)).IgnoreError();
  const std::string holder = c->RegisterActor("holder")->actor_id();
  ASSERT_EQ(Lease(*c, holder, 1).prompts_size(), 1);
  ASSERT_TRUE(c->RegisterActor("b").ok());
  ASSERT_TRUE(c->RegisterActor("c").ok());
  const absl::StatusOr<v1::RegisterResponse> refused = c->RegisterActor("flood");
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted) << refused.status();
  EXPECT_NE(refused.status().message().find("coordinator.max_actors 3"), std::string::npos)
      << refused.status();
  EXPECT_EQ(c->Stats().actors, 3);
  // Past 2 lease_ms of silence: b and c are forgotten at the next registration; the holder's
  // lease expired meanwhile, so the expiry pass forgets it too.
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  const absl::StatusOr<v1::RegisterResponse> later = c->RegisterActor("later");
  ASSERT_TRUE(later.ok()) << later.status();
  EXPECT_EQ(c->Stats().actors, 2) << "b and c forgotten; the holder kept while it held a lease";
  c->ExpireLeases();
  EXPECT_EQ(c->Stats().actors, 1) << "the holder's lease expired: forgotten";
  v1::HeartbeatRequest hb;
  hb.set_actor_id(holder);
  EXPECT_EQ(c->Heartbeat(hb).status().code(), absl::StatusCode::kNotFound)
      << "a forgotten actor is told to register again";
}

TEST_F(LeaseLifecycleTest, AttemptsAndFailedPromptsSurviveARestart) {
  config_.max_attempts = 2;
  std::string id, retried;
  {
    auto c = Open();
    id = SubmitAndFailIt(*c);
    retried = c->Submit(Request(1, 2))->prompt_set_id();
    EXPECT_FALSE(LeaseAndRelease(*c, c->RegisterActor("b")->actor_id(), "once").prompt_failed());
  }
  auto c = Open();
  ExpectFailedWithItsReason(*c->Get(id), 2);
  // The other prompt has one attempt left: its next failure is its last.
  EXPECT_EQ(c->Get(retried)->prompts_pending(), 1);
  EXPECT_TRUE(
      LeaseAndRelease(*c, c->RegisterActor("c")->actor_id(), "out of blocks").prompt_failed());
  ExpectFailedWithItsReason(*c->Get(retried), 2);
}

TEST_F(LeaseLifecycleTest, AttemptsAndFailedPromptsSurviveACompaction) {
  config_.max_attempts = 2;
  config_.compact_log_bytes = 1;  // compact after every append
  std::string id, retried;
  {
    auto c = Open();
    id = SubmitAndFailIt(*c);
    retried = c->Submit(Request(1, 2))->prompt_set_id();
    EXPECT_FALSE(LeaseAndRelease(*c, c->RegisterActor("b")->actor_id(), "once").prompt_failed());
    EXPECT_GT(c->Stats().log_compactions, 0);
  }
  auto c = Open();
  ExpectFailedWithItsReason(*c->Get(id), 2);
  EXPECT_TRUE(
      LeaseAndRelease(*c, c->RegisterActor("c")->actor_id(), "out of blocks").prompt_failed());
  ExpectFailedWithItsReason(*c->Get(retried), 2);
}

}  // namespace
}  // namespace prl::coordinator
