#include "coordinator/coordinator.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "coordinator/coordinator_server.h"
#include "prl/v1/prompt.grpc.pb.h"
#include "rpc/grpc_util.h"
#include "tests/status_testing.h"

namespace prl::coordinator {
namespace {

namespace v1 = prl::v1;
using ::prl::testing::IsError;
constexpr absl::StatusCode kInvalid = absl::StatusCode::kInvalidArgument;

class CoordinatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           absl::StrCat("prl_coordinator_test_", getpid(), "_", counter_++);
    std::filesystem::remove_all(dir_);
    config_.log_path = (dir_ / "prompts.log").string();
    config_.vocab_size = 50;
    config_.max_position_embeddings = 64;
    config_.lease_ms = 60'000;
    config_.heartbeat_ms = 1'000;
    config_.tokenize = [](absl::string_view text) -> absl::StatusOr<std::vector<int32_t>> {
      std::vector<int32_t> ids;
      for (char ch : text) {
        if (ch < 'a' || ch > 'z') {
          return absl::InvalidArgumentError(
              absl::StrCat("unknown character '", std::string(1, ch), "'"));
        }
        ids.push_back(ch - 'a');
      }
      return ids;
    };
    config_.validate_reward = [](const v1::RewardSpec& r) {
      return r.name() == "exact_match"
                 ? absl::OkStatus()
                 : absl::InvalidArgumentError(absl::StrCat("unknown reward '", r.name(), "'"));
    };
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::unique_ptr<Coordinator> Open() {
    absl::StatusOr<std::unique_ptr<Coordinator>> c = Coordinator::Open(config_);
    EXPECT_TRUE(c.ok()) << c.status();
    return std::move(*c);
  }

  static v1::SubmitPromptSetRequest Request(int prompts, int samples = 2) {
    v1::SubmitPromptSetRequest r;
    r.set_name("test");
    for (int i = 0; i < prompts; ++i) {
      v1::Prompt* p = r.add_prompts();
      p->mutable_tokens()->add_ids(1 + i % 40);
      p->mutable_tokens()->add_ids(2);
      p->set_reference(absl::StrCat(i));
    }
    r.set_samples_per_prompt(samples);
    v1::RolloutSampling* s = r.mutable_sampling();
    s->set_temperature(1.0f);
    s->set_top_p(1.0f);
    s->set_max_tokens(8);
    r.mutable_reward()->set_name("exact_match");
    return r;
  }

  static v1::CompleteRequest Done(const std::string& actor, const v1::LeasedPrompt& p,
                                  double reward = 1.0) {
    v1::CompleteRequest c;
    c.set_actor_id(actor);
    c.set_lease_id(p.lease_id());
    c.mutable_result()->set_prompt_index(p.prompt_index());
    for (int i = 0; i < p.samples(); ++i) {
      c.mutable_result()->add_rewards(reward);
      c.mutable_result()->add_completion_tokens(3);
    }
    return c;
  }

  static v1::LeaseRequest LeaseOf(const std::string& actor, int n) {
    v1::LeaseRequest r;
    r.set_actor_id(actor);
    r.set_max_prompts(n);
    return r;
  }

  std::filesystem::path dir_;
  CoordinatorConfig config_;
  static inline int counter_ = 0;
};

TEST_F(CoordinatorTest, ASubmittedSetIsLeasedCompletedAndDone) {
  auto c = Open();
  auto submitted = c->Submit(Request(3));
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  const std::string actor = c->RegisterActor("a").actor_id();
  auto leased = c->Lease(LeaseOf(actor, 10));
  ASSERT_TRUE(leased.ok());
  ASSERT_EQ(leased->prompts_size(), 3);
  EXPECT_EQ(leased->prompts(0).samples(), 2);
  EXPECT_EQ(leased->prompts(1).prompt_tokens_size(), 2);
  for (const auto& p : leased->prompts()) {
    auto done = c->Complete(Done(actor, p, 0.5));
    ASSERT_TRUE(done.ok()) << done.status();
    EXPECT_TRUE(done->accepted());
  }
  auto status = c->Get(submitted->prompt_set_id());
  ASSERT_TRUE(status.ok());
  EXPECT_EQ(status->state(), v1::PROMPT_SET_STATE_DONE);
  EXPECT_EQ(status->prompts_done(), 3);
  EXPECT_DOUBLE_EQ(status->mean_reward(), 0.5);
}

TEST_F(CoordinatorTest, MalformedSubmissionsAreInvalidArgumentNamingTheFieldAndChangeNothing) {
  auto c = Open();
  struct Case {
    std::function<void(v1::SubmitPromptSetRequest&)> mutate;
    std::vector<absl::string_view> message;
  };
  const std::vector<Case> cases = {
      {[](auto& r) { r.clear_prompts(); }, {"prompts", "at least one prompt"}},
      {[](auto& r) { r.mutable_reward()->set_name("nope"); }, {"reward", "unknown reward 'nope'"}},
      {[](auto& r) { r.mutable_prompts(1)->mutable_tokens()->set_ids(0, 50); },
       {"prompts[1].tokens[0]", "[0, 50)", "50"}},
      {[](auto& r) { r.set_samples_per_prompt(0); }, {"samples_per_prompt", "1 to 1024", "0"}},
      {[](auto& r) { r.set_samples_per_prompt(100000); }, {"samples_per_prompt", "100000"}},
      {[](auto& r) { r.mutable_sampling()->set_max_tokens(63); },
       {"prompts[0]", "2 tokens + sampling.max_tokens 63 = 65", "max_position_embeddings = 64"}},
      {[](auto& r) { r.mutable_prompts(0)->mutable_tokens()->clear_ids(); },
       {"prompts[0]", "an empty prompt"}},
      {[](auto& r) { r.mutable_prompts(2)->set_text("ab1"); }, {"prompts[2].text", "'1'"}},
      {[](auto& r) { r.mutable_sampling()->set_top_p(0); }, {"sampling.top_p", "(0, 1]"}},
      {[](auto& r) { r.clear_sampling(); }, {"sampling"}},
  };
  for (const Case& k : cases) {
    v1::SubmitPromptSetRequest r = Request(3);
    k.mutate(r);
    const absl::Status status = c->Submit(r).status();
    EXPECT_EQ(status.code(), kInvalid) << status;
    for (absl::string_view part : k.message) {
      EXPECT_NE(status.message().find(part), absl::string_view::npos)
          << "'" << part << "' not in: " << status;
    }
  }
  EXPECT_TRUE(c->List().empty());
  // Still working, and text prompts are tokenised.
  v1::SubmitPromptSetRequest r = Request(1);
  r.mutable_prompts(0)->set_text("hello");
  ASSERT_TRUE(c->Submit(r).ok());
  const std::string actor = c->RegisterActor("a").actor_id();
  auto leased = c->Lease(LeaseOf(actor, 1));
  ASSERT_TRUE(leased.ok());
  ASSERT_EQ(leased->prompts_size(), 1);
  EXPECT_EQ(std::vector<int32_t>(leased->prompts(0).prompt_tokens().begin(),
                                 leased->prompts(0).prompt_tokens().end()),
            (std::vector<int32_t>{7, 4, 11, 11, 14}));
}

TEST_F(CoordinatorTest, MorePendingWorkThanTheLimitIsResourceExhausted) {
  config_.max_pending_prompts = 5;
  auto c = Open();
  ASSERT_TRUE(c->Submit(Request(4)).ok());
  EXPECT_TRUE(IsError(c->Submit(Request(2)).status(), absl::StatusCode::kResourceExhausted,
                      {"4 prompts are pending", "limit is 5"}));
  ASSERT_TRUE(c->Submit(Request(1)).ok());
}

TEST_F(CoordinatorTest, ARetriedSubmitWithTheSameKeyIsNotDuplicated) {
  auto c = Open();
  v1::SubmitPromptSetRequest r = Request(2);
  r.set_idempotency_key("k1");
  auto first = c->Submit(r), second = c->Submit(r);
  ASSERT_TRUE(first.ok() && second.ok());
  EXPECT_EQ(first->prompt_set_id(), second->prompt_set_id());
  EXPECT_FALSE(first->duplicate());
  EXPECT_TRUE(second->duplicate());
  EXPECT_EQ(c->List().size(), 1u);
  // Also after a restart.
  c.reset();
  c = Open();
  auto third = c->Submit(r);
  ASSERT_TRUE(third.ok());
  EXPECT_TRUE(third->duplicate());
  EXPECT_EQ(third->prompt_set_id(), first->prompt_set_id());
}

TEST_F(CoordinatorTest, ARestartKeepsAcceptedSetsAndCompletedGroupsAndReRunsTheRest) {
  std::string id;
  {
    auto c = Open();
    id = c->Submit(Request(4))->prompt_set_id();
    const std::string actor = c->RegisterActor("a").actor_id();
    auto leased = c->Lease(LeaseOf(actor, 3));
    ASSERT_EQ(leased->prompts_size(), 3);
    ASSERT_TRUE(c->Complete(Done(actor, leased->prompts(0))).ok());
    // prompts 1 and 2 are in flight when the coordinator dies.
  }
  auto c = Open();
  auto status = c->Get(id);
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ(status->prompts_done(), 1);
  EXPECT_EQ(status->prompts_pending(), 3);
  const std::string actor = c->RegisterActor("b").actor_id();
  auto leased = c->Lease(LeaseOf(actor, 10));
  ASSERT_EQ(leased->prompts_size(), 3);
  for (const auto& p : leased->prompts()) ASSERT_TRUE(c->Complete(Done(actor, p)).ok());
  EXPECT_EQ(c->Get(id)->state(), v1::PROMPT_SET_STATE_DONE);
}

TEST_F(CoordinatorTest, AnExpiredLeaseIsReRunAndTheLateCompletionIsADuplicate) {
  config_.lease_ms = 200;
  config_.heartbeat_ms = 50;
  auto c = Open();
  const std::string id = c->Submit(Request(1))->prompt_set_id();
  const std::string dead = c->RegisterActor("dies").actor_id();
  auto first = c->Lease(LeaseOf(dead, 1));
  ASSERT_EQ(first->prompts_size(), 1);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const std::string alive = c->RegisterActor("lives").actor_id();
  auto second = c->Lease(LeaseOf(alive, 1));
  ASSERT_EQ(second->prompts_size(), 1) << "the expired lease was not re-queued";
  EXPECT_EQ(second->prompts(0).prompt_index(), 0);
  EXPECT_TRUE(c->Complete(Done(alive, second->prompts(0))).value().accepted());
  EXPECT_FALSE(c->Complete(Done(dead, first->prompts(0))).value().accepted());
  EXPECT_EQ(c->Stats().leases_expired, 1);
  EXPECT_EQ(c->Get(id)->prompts_done(), 1);
}

TEST_F(CoordinatorTest, HeartbeatsKeepLeasesAlive) {
  config_.lease_ms = 300;
  config_.heartbeat_ms = 50;
  auto c = Open();
  c->Submit(Request(1)).IgnoreError();
  const std::string actor = c->RegisterActor("a").actor_id();
  auto leased = c->Lease(LeaseOf(actor, 1));
  ASSERT_EQ(leased->prompts_size(), 1);
  v1::HeartbeatRequest hb;
  hb.set_actor_id(actor);
  for (int i = 0; i < 8; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    ASSERT_TRUE(c->Heartbeat(hb).ok());
    c->ExpireLeases();
  }
  EXPECT_EQ(c->Stats().leases_expired, 0);
  EXPECT_TRUE(c->Complete(Done(actor, leased->prompts(0))).value().accepted());
}

TEST_F(CoordinatorTest, TheMaxLagBudgetBoundsWorkInFlightPlusUntrainedGroups) {
  config_.max_lag = 1;
  config_.groups_per_step = 2;  // at most (1 + 1) * 2 = 4 groups ahead of the learner
  auto c = Open();
  c->Submit(Request(10)).IgnoreError();
  const std::string actor = c->RegisterActor("a").actor_id();
  auto leased = c->Lease(LeaseOf(actor, 10));
  ASSERT_EQ(leased->prompts_size(), 4);
  for (int i = 0; i < 2; ++i) ASSERT_TRUE(c->Complete(Done(actor, leased->prompts(i))).ok());
  EXPECT_EQ(c->Lease(LeaseOf(actor, 10))->prompts_size(), 0) << "completed but not trained on";
  c->LearnerProgress(1, 2);
  EXPECT_EQ(c->Lease(LeaseOf(actor, 10))->prompts_size(), 2);
}

TEST_F(CoordinatorTest, StatsCountThrottledLeaseRequestsAndLeasesPerActor) {
  config_.max_lag = 0;
  config_.groups_per_step = 3;  // at most 3 groups ahead of the learner
  auto c = Open();
  c->Submit(Request(5)).IgnoreError();
  const std::string a = c->RegisterActor("actors-x7k2p").actor_id();
  const std::string b = c->RegisterActor("actors-q4m8z").actor_id();
  EXPECT_EQ(c->Lease(LeaseOf(a, 2))->prompts_size(), 2);  // within the budget
  EXPECT_EQ(c->Stats().lease_requests_throttled, 0);
  EXPECT_EQ(c->Lease(LeaseOf(b, 2))->prompts_size(), 1);  // cut to the budget's last group
  EXPECT_EQ(c->Lease(LeaseOf(b, 2))->prompts_size(), 0);  // refused: 2 prompts still pending
  const CoordinatorStats stats = c->Stats();
  EXPECT_EQ(stats.lease_requests_throttled, 2);
  EXPECT_EQ(stats.prompts_leased, (std::map<std::string, int64_t>{{"actors-x7k2p", 2},
                                                                   {"actors-q4m8z", 1}}));
}

TEST_F(CoordinatorTest, CancelledSetsAreNotLeased) {
  auto c = Open();
  const std::string id = c->Submit(Request(3))->prompt_set_id();
  auto cancelled = c->Cancel(id);
  ASSERT_TRUE(cancelled.ok());
  EXPECT_EQ(cancelled->state(), v1::PROMPT_SET_STATE_CANCELLED);
  const std::string actor = c->RegisterActor("a").actor_id();
  EXPECT_EQ(c->Lease(LeaseOf(actor, 10))->prompts_size(), 0);
  EXPECT_EQ(c->Cancel("ps-missing").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(CoordinatorTest, UnknownActorsAndLeasesAreNotFound) {
  auto c = Open();
  EXPECT_TRUE(IsError(c->Lease(LeaseOf("actor-x", 1)).status(), absl::StatusCode::kNotFound,
                      {"register again"}));
  v1::CompleteRequest bogus;
  bogus.set_lease_id("nonsense");
  EXPECT_EQ(c->Complete(bogus).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(CoordinatorTest, ACompletionWithTheWrongNumberOfRewardsIsRefused) {
  auto c = Open();
  c->Submit(Request(1)).IgnoreError();
  const std::string actor = c->RegisterActor("a").actor_id();
  auto leased = c->Lease(LeaseOf(actor, 1));
  v1::CompleteRequest done = Done(actor, leased->prompts(0));
  done.mutable_result()->add_rewards(1.0);
  EXPECT_TRUE(IsError(c->Complete(done).status(), kInvalid, {"result.rewards", "2 rewards"}));
}

// Over gRPC on loopback: submit, watch the progress stream while an actor works, restart.
TEST_F(CoordinatorTest, PromptServiceOverGrpcStreamsProgressUntilDone) {
  auto c = Open();
  auto server = CoordinatorServer::Start(c.get(), "127.0.0.1:0");
  ASSERT_TRUE(server.ok()) << server.status();
  auto channel =
      grpc::CreateCustomChannel(absl::StrCat("127.0.0.1:", (*server)->port()),
                                grpc::InsecureChannelCredentials(), rpc::ChannelArgs(64 << 20));
  auto prompts = v1::PromptService::NewStub(channel);
  auto actors = v1::ActorControl::NewStub(channel);
  grpc::ClientContext submit_ctx;
  v1::SubmitPromptSetResponse submitted;
  ASSERT_TRUE(prompts->SubmitPromptSet(&submit_ctx, Request(3), &submitted).ok());

  grpc::ClientContext bad_ctx;
  v1::SubmitPromptSetResponse ignored;
  v1::SubmitPromptSetRequest bad = Request(1);
  bad.set_samples_per_prompt(0);
  const grpc::Status refused = prompts->SubmitPromptSet(&bad_ctx, bad, &ignored);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(refused.error_message().find("samples_per_prompt"), std::string::npos);

  std::thread actor([&] {
    grpc::ClientContext rc;
    v1::RegisterRequest reg;
    v1::RegisterResponse me;
    ASSERT_TRUE(actors->Register(&rc, reg, &me).ok());
    int done = 0;
    while (done < 3) {
      grpc::ClientContext lc;
      v1::LeaseResponse leased;
      ASSERT_TRUE(actors->LeasePrompts(&lc, LeaseOf(me.actor_id(), 1), &leased).ok());
      for (const auto& p : leased.prompts()) {
        grpc::ClientContext cc;
        v1::CompleteResponse r;
        ASSERT_TRUE(actors->Complete(&cc, Done(me.actor_id(), p), &r).ok());
        ++done;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });
  grpc::ClientContext watch_ctx;
  watch_ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  v1::WatchPromptSetRequest watch;
  watch.set_prompt_set_id(submitted.prompt_set_id());
  auto reader = prompts->WatchPromptSet(&watch_ctx, watch);
  v1::PromptSetEvent event;
  int groups = 0;
  v1::PromptSetState last = v1::PROMPT_SET_STATE_UNSPECIFIED;
  while (reader->Read(&event)) {
    if (event.has_group()) ++groups;
    if (event.has_status()) last = event.status().state();
  }
  EXPECT_TRUE(reader->Finish().ok());
  actor.join();
  EXPECT_EQ(last, v1::PROMPT_SET_STATE_DONE);
  EXPECT_LE(groups, 3);  // the ones completed after the watch began

  // A restarted coordinator still knows the set.
  (*server)->Shutdown();
  server->reset();
  c.reset();
  c = Open();
  EXPECT_EQ(c->Get(submitted.prompt_set_id())->state(), v1::PROMPT_SET_STATE_DONE);
}

}  // namespace
}  // namespace prl::coordinator
