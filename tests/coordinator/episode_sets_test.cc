// The coordinator's side of agentic episodes and of sharing actors: every environment field is
// bounded and timeouts are capped; a lease carries the prompt as submitted (messages, text);
// one environment's sets never hold more than a fair share of an actor's slots while others
// wait (coordinator/fair_share.h: leasing skips them, a heartbeat asks the excess back, and a
// lease given back on request is not a failed attempt); a heartbeat names the leases an actor
// lists but no longer holds; a duplicate submission is answered only once the first is durable.
#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <set>
#include <thread>

#include "coordinator/fair_share.h"
#include "tests/coordinator/coordinator_fixture.h"

namespace prl::coordinator {
namespace {

constexpr absl::StatusCode kInvalid = absl::StatusCode::kInvalidArgument;

class EpisodeSetsTest : public CoordinatorTest {
 protected:
  static v1::SubmitPromptSetRequest Episodes(int prompts, const std::string& address) {
    v1::SubmitPromptSetRequest r = Request(prompts);
    r.clear_reward();
    r.mutable_environment()->set_name("game");
    r.mutable_environment()->set_address(address);
    return r;
  }
  static v1::ActorCapacity Slots(int32_t slots) {
    v1::ActorCapacity c;
    c.set_max_prompts_in_flight(slots);
    return c;
  }
  static std::set<std::string> SetsOf(const v1::LeaseResponse& r) {
    std::set<std::string> sets;
    for (const v1::LeasedPrompt& p : r.prompts()) sets.insert(p.prompt_set_id());
    return sets;
  }
};

TEST_F(EpisodeSetsTest, EveryEnvironmentFieldIsBoundedAndTimeoutsAreCapped) {
  config_.env_addresses = {"10.0.0.7:7000"};
  config_.max_env_timeout_s = 20;
  auto c = Open();
  struct Case {
    std::function<void(v1::EnvironmentSpec&)> mutate;
    std::vector<std::string> words;
  };
  const std::vector<Case> cases = {
      {[](auto& e) { e.set_name(std::string(300, 'n')); },
       {"environment.name: expected at most 256", "found 300"}},
      {[](auto& e) {
         const std::string value(1, 'v');
         for (int i = 0; i < 65; ++i) (*e.mutable_parameters())[absl::StrCat("k", i)] = value;
       },
       {"environment.parameters: expected at most 64", "found 65"}},
      {[](auto& e) { (*e.mutable_parameters())["big"] = std::string(5000, 'v'); },
       {"environment.parameters[big]: expected at most 4096"}},
      {[](auto& e) {
         for (int i = 0; i < 20; ++i) {
           (*e.mutable_parameters())[absl::StrCat("k", i)] = std::string(4000, 'v');
         }
       },
       {"environment.parameters (bytes in all): expected at most 65536"}},
      {[](auto& e) { e.set_max_episode_tokens(7); },
       {"environment.max_episode_tokens", "at least a turn's tokens (8", "found 7"}},
      {[](auto& e) { e.set_timeout_s(25); },
       {"environment.timeout_s", "to 20 (coordinator.max_env_timeout_s)", "found 25"}},
  };
  for (const Case& k : cases) {
    v1::SubmitPromptSetRequest r = Episodes(1, "10.0.0.7:7000");
    k.mutate(*r.mutable_environment());
    const absl::Status refused = c->Submit(r).status();
    EXPECT_EQ(refused.code(), kInvalid) << refused;
    for (const std::string& word : k.words) {
      EXPECT_NE(refused.message().find(word), absl::string_view::npos) << refused;
    }
  }
  // The default call budget is 30 s, or the cap when it is lower.
  ASSERT_TRUE(c->Submit(Episodes(1, "10.0.0.7:7000")).ok());
  const std::string actor = c->RegisterActor("a")->actor_id();
  const v1::LeaseResponse leased = *c->Lease(LeaseOf(actor, 1));
  ASSERT_EQ(leased.prompts_size(), 1);
  EXPECT_EQ(leased.prompts(0).environment().timeout_s(), 20);
}

// A set may name an agent instead of an environment: only an address the operator allowed
// (coordinator.agent_addresses; actors hand it episode keys), never beside an environment,
// every field bounded naming it; the lease carries the agent with its defaults and the prompt.
TEST_F(EpisodeSetsTest, AnAgentIsAllowListedBoundedAndLeasedWithItsDefaults) {
  config_.env_addresses = {"10.0.0.7:7000"};
  config_.agent_addresses = {"10.0.0.9:7100"};
  config_.max_agent_timeout_s = 120;
  auto c = Open();
  auto agent_set = [](const std::string& address) {
    v1::SubmitPromptSetRequest r = Request(1);
    r.clear_reward();
    r.mutable_agent()->set_name("calc");
    r.mutable_agent()->set_address(address);
    return r;
  };
  struct Case {
    std::function<void(v1::SubmitPromptSetRequest&)> mutate;
    std::vector<std::string> words;
  };
  const std::vector<Case> cases = {
      {[](auto& r) { r.mutable_agent()->set_address("10.0.0.7:7000"); },
       {"agent.address: expected one of coordinator.agent_addresses: 10.0.0.9:7100",
        "found '10.0.0.7:7000'"}},
      {[](auto& r) { r.mutable_environment()->set_address("10.0.0.7:7000"); },
       {"agent: expected unset when the set names an environment"}},
      {[](auto& r) { r.mutable_agent()->set_name(std::string(300, 'n')); },
       {"agent.name: expected at most 256", "found 300"}},
      {[](auto& r) { (*r.mutable_agent()->mutable_parameters())["big"] = std::string(5000, 'v'); },
       {"agent.parameters[big]: expected at most 4096"}},
      {[](auto& r) { r.mutable_agent()->set_max_calls(1025); },
       {"agent.max_calls", "to 1024", "found 1025"}},
      {[](auto& r) { r.mutable_agent()->set_max_tokens_per_call(9); },
       {"agent.max_tokens_per_call", "sampling.max_tokens (8)", "found 9"}},
      {[](auto& r) { r.mutable_agent()->set_max_episode_tokens(7); },
       {"agent.max_episode_tokens", "at least a call's tokens (8", "found 7"}},
      {[](auto& r) { r.mutable_agent()->set_tool_call_format("xml"); },
       {"agent.tool_call_format", "hermes, llama3_json or none", "found 'xml'"}},
      {[](auto& r) { r.mutable_agent()->set_timeout_s(121); },
       {"agent.timeout_s", "to 120 (coordinator.max_agent_timeout_s)", "found 121"}},
  };
  for (const Case& k : cases) {
    v1::SubmitPromptSetRequest r = agent_set("10.0.0.9:7100");
    k.mutate(r);
    const absl::Status refused = c->Submit(r).status();
    EXPECT_EQ(refused.code(), kInvalid) << refused;
    for (const std::string& word : k.words) {
      EXPECT_NE(refused.message().find(word), absl::string_view::npos) << refused;
    }
  }
  v1::SubmitPromptSetRequest r = agent_set("10.0.0.9:7100");
  (*r.mutable_agent()->mutable_parameters())["tools"] = "calculator";
  r.mutable_prompts(0)->set_text("abc");
  ASSERT_TRUE(c->Submit(r).ok());
  const std::string actor = c->RegisterActor("a")->actor_id();
  const v1::LeaseResponse leased = *c->Lease(LeaseOf(actor, 1));
  ASSERT_EQ(leased.prompts_size(), 1);
  const v1::LeasedPrompt& p = leased.prompts(0);
  EXPECT_FALSE(p.has_environment());
  EXPECT_EQ(p.agent().address(), "10.0.0.9:7100");
  EXPECT_EQ(p.agent().parameters().at("tools"), "calculator");
  EXPECT_EQ(p.agent().max_calls(), 16);
  EXPECT_EQ(p.agent().max_tokens_per_call(), 8);
  EXPECT_EQ(p.agent().timeout_s(), 120) << "the default 300 s, capped";
  EXPECT_EQ(p.episode_prompt().text(), "abc");
}

// The lease of an agentic set carries each prompt as submitted (its chat or text), also after
// a restart (from the log).
TEST_F(EpisodeSetsTest, AnEpisodeLeaseCarriesThePromptAsSubmitted) {
  config_.env_addresses = {"10.0.0.7:7000"};
  {
    auto c = Open();
    v1::SubmitPromptSetRequest r = Episodes(2, "10.0.0.7:7000");
    v1::Chat* chat = r.mutable_prompts(0)->mutable_chat();
    v1::ChatMessage* m = chat->add_messages();
    m->set_role("user");
    m->set_content("abc");
    chat->set_template_kwargs_json(R"({"enable_thinking": false})");
    r.mutable_prompts(1)->set_text("hello");
    ASSERT_TRUE(c->Submit(r).ok());
  }
  auto c = Open();  // replayed from the log
  const std::string actor = c->RegisterActor("a")->actor_id();
  const v1::LeaseResponse leased = *c->Lease(LeaseOf(actor, 2));
  ASSERT_EQ(leased.prompts_size(), 2);
  for (const v1::LeasedPrompt& p : leased.prompts()) {
    if (p.prompt_index() == 0) {
      ASSERT_TRUE(p.episode_prompt().has_chat());
      EXPECT_EQ(p.episode_prompt().chat().messages(0).content(), "abc");
      EXPECT_EQ(p.episode_prompt().chat().template_kwargs_json(), R"({"enable_thinking": false})");
      EXPECT_EQ(p.prompt_tokens_size(), 4) << "'abc' and the template's 'x', tokenised";
    } else {
      EXPECT_EQ(p.episode_prompt().text(), "hello");
    }
  }
}

// A hung environment's set took every slot of the actor; a healthy set arrives: leasing gives
// the hung one nothing more, the heartbeat asks back its newest leases beyond the fair share,
// and those come back to the queue without an attempt counted.
TEST_F(EpisodeSetsTest, OneEnvironmentsSetsHoldAtMostAFairShareWhileOthersWait) {
  config_.env_addresses = {"10.0.0.7:7000", "10.0.0.8:7000"};
  config_.max_attempts = 1;  // a release counted as an attempt would fail its prompt
  auto c = Open();
  const std::string hung = c->Submit(Episodes(20, "10.0.0.7:7000"))->prompt_set_id();
  const std::string actor = c->RegisterActor("a", Slots(8))->actor_id();
  v1::LeaseResponse first = *c->Lease(LeaseOf(actor, 8));
  ASSERT_EQ(first.prompts_size(), 8) << "alone, a set takes every slot";
  const std::string healthy = c->Submit(Episodes(20, "10.0.0.8:7000"))->prompt_set_id();
  v1::HeartbeatRequest beat;
  beat.set_actor_id(actor);
  for (const v1::LeasedPrompt& p : first.prompts()) beat.add_held_lease_ids(p.lease_id());
  const v1::HeartbeatResponse answer = *c->Heartbeat(beat);
  ASSERT_EQ(answer.reclaim_lease_ids_size(), 4) << "ceil(8 slots / 2 classes) = 4 each";
  EXPECT_EQ(answer.lost_lease_ids_size(), 0);
  // The newest four (leased last).
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(answer.reclaim_lease_ids(i), first.prompts(7 - i).lease_id());
  }
  for (const std::string& id : answer.reclaim_lease_ids()) {
    v1::ReleaseRequest release;
    release.set_actor_id(actor);
    release.set_lease_id(id);
    release.set_reason(v1::RELEASE_REASON_RECLAIMED);
    ASSERT_TRUE(c->Release(release).ok());
  }
  const v1::LeaseResponse next = *c->Lease(LeaseOf(actor, 4));
  ASSERT_EQ(next.prompts_size(), 4);
  EXPECT_EQ(SetsOf(next), std::set<std::string>{healthy}) << "the waiting set gets the slots";
  EXPECT_EQ(c->Get(hung)->prompts_failed(), 0);
  EXPECT_EQ(c->Get(hung)->prompts_pending(), 12 + 4) << "given back: pending again";
  EXPECT_EQ(c->Stats().leases_reclaimed, 4);
  EXPECT_EQ(c->Stats().leases_released, 0);
}

TEST_F(EpisodeSetsTest, AReclaimedReleaseNobodyAskedForIsAFailedAttempt) {
  config_.env_addresses = {"10.0.0.7:7000"};
  config_.max_attempts = 1;
  auto c = Open();
  const std::string set = c->Submit(Episodes(1, "10.0.0.7:7000"))->prompt_set_id();
  const std::string actor = c->RegisterActor("a", Slots(8))->actor_id();
  const v1::LeaseResponse leased = *c->Lease(LeaseOf(actor, 1));
  ASSERT_EQ(leased.prompts_size(), 1);
  v1::ReleaseRequest release;
  release.set_actor_id(actor);
  release.set_lease_id(leased.prompts(0).lease_id());
  release.set_reason(v1::RELEASE_REASON_RECLAIMED);
  ASSERT_TRUE(c->Release(release).ok());
  EXPECT_EQ(c->Get(set)->prompts_failed(), 1) << "max_attempts 1: one failed attempt fails it";
}

TEST_F(EpisodeSetsTest, AHeartbeatNamesTheLeasesItListsButDoesNotHold) {
  auto c = Open();
  ASSERT_TRUE(c->Submit(Request(2)).ok());
  const std::string a = c->RegisterActor("a")->actor_id();
  const std::string b = c->RegisterActor("b")->actor_id();
  const v1::LeaseResponse of_b = *c->Lease(LeaseOf(b, 1));
  const v1::LeaseResponse of_a = *c->Lease(LeaseOf(a, 1));
  ASSERT_EQ(of_a.prompts_size(), 1);
  ASSERT_EQ(of_b.prompts_size(), 1);
  v1::HeartbeatRequest beat;
  beat.set_actor_id(a);
  beat.add_held_lease_ids(of_a.prompts(0).lease_id());
  beat.add_held_lease_ids(of_b.prompts(0).lease_id());  // b's
  beat.add_held_lease_ids("never-leased");
  const v1::HeartbeatResponse answer = *c->Heartbeat(beat);
  EXPECT_EQ(std::set<std::string>(answer.lost_lease_ids().begin(), answer.lost_lease_ids().end()),
            (std::set<std::string>{of_b.prompts(0).lease_id(), "never-leased"}));
}

// The first submission is held in its fsync; a retry with the same key must not be told the set
// exists before it is durable.
TEST_F(EpisodeSetsTest, ADuplicateIsAnsweredOnlyOnceTheFirstSubmissionIsDurable) {
  std::mutex mu;
  std::condition_variable cv;
  bool syncing = false, release = false;
  std::atomic<bool> synced{false};
  config_.log_before_sync = [&] {
    std::unique_lock<std::mutex> lock(mu);
    if (synced) return;
    syncing = true;
    cv.notify_all();
    cv.wait(lock, [&] { return release; });
  };
  auto c = Open();
  v1::SubmitPromptSetRequest r = Request(1);
  r.set_idempotency_key("once");
  auto first = std::async(std::launch::async, [&] { return c->Submit(r); });
  {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return syncing; });
  }
  std::atomic<bool> answered_before_sync{false};
  auto duplicate = std::async(std::launch::async, [&] {
    auto answer = c->Submit(r);
    if (!synced) answered_before_sync = true;
    return answer;
  });
  // Give the duplicate every chance to answer early (it must not): then let the fsync go.
  EXPECT_EQ(duplicate.wait_for(std::chrono::milliseconds(300)), std::future_status::timeout);
  {
    std::lock_guard<std::mutex> lock(mu);
    synced = true;
    release = true;
    cv.notify_all();
  }
  const auto a = first.get();
  const auto b = duplicate.get();
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_TRUE(b->duplicate());
  EXPECT_EQ(b->prompt_set_id(), a->prompt_set_id());
  EXPECT_FALSE(answered_before_sync);
}

TEST(FairShareTest, AClassAloneTakesEverySlotAndSharesThemOnceAnotherWaits) {
  FairShare alone(8, {}, {"a"});
  for (int i = 0; i < 8; ++i) EXPECT_TRUE(alone.MayTake("a"));
  EXPECT_TRUE(alone.ToReclaim().empty());

  FairShare two(8, {{"a", 8}}, {"a", "b"});
  EXPECT_EQ(two.share(), 4);
  EXPECT_EQ(two.ToReclaim(), (std::map<std::string, int64_t>{{"a", 4}}));
  EXPECT_FALSE(two.MayTake("a"));
  EXPECT_TRUE(two.MayTake("b"));
  EXPECT_EQ(two.ToReclaim(), (std::map<std::string, int64_t>{{"a", 3}})) << "b holds one now";

  // Free slots cover the waiting class: nothing is asked back.
  FairShare room(8, {{"a", 4}}, {"a", "b"});
  EXPECT_TRUE(room.ToReclaim().empty());
  // Three classes: ceil(8 / 3) = 3 each; the two waiting below it can use 3 + 3 - 0 free.
  FairShare three(8, {{"a", 8}}, {"a", "b", "c"});
  EXPECT_EQ(three.share(), 3);
  EXPECT_EQ(three.ToReclaim(), (std::map<std::string, int64_t>{{"a", 5}}));
  // Unknown slots (an actor that did not say): nothing is limited.
  FairShare unknown(0, {{"a", 100}}, {"a", "b"});
  EXPECT_TRUE(unknown.MayTake("a"));
  EXPECT_TRUE(unknown.ToReclaim().empty());
}

}  // namespace
}  // namespace prl::coordinator
