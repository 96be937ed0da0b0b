// The coordinator's prompt sets: submission checks, text and chat prompts, leasing and
// completing, restarts, retries, watchers, listing, cancellation and the PromptService over
// gRPC. Leases and the lag budget are in lag_budget_test.cc.
#include "coordinator/coordinator.h"

#include <gtest/gtest.h>

#include <fstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "coordinator/coordinator_server.h"
#include "core/group_id.h"
#include "core/status_macros.h"
#include "prl/v1/prompt.grpc.pb.h"
#include "rpc/grpc_util.h"
#include "tests/coordinator/coordinator_fixture.h"
#include "tests/status_testing.h"

namespace prl::coordinator {
namespace {

namespace v1 = prl::v1;
using ::prl::testing::IsError;
constexpr absl::StatusCode kInvalid = absl::StatusCode::kInvalidArgument;

TEST_F(CoordinatorTest, ASubmittedSetIsLeasedCompletedAndDone) {
  auto c = Open();
  auto submitted = c->Submit(Request(3));
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  const std::string actor = c->RegisterActor("a")->actor_id();
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
  const std::string actor = c->RegisterActor("a")->actor_id();
  auto leased = c->Lease(LeaseOf(actor, 1));
  ASSERT_TRUE(leased.ok());
  ASSERT_EQ(leased->prompts_size(), 1);
  EXPECT_EQ(std::vector<int32_t>(leased->prompts(0).prompt_tokens().begin(),
                                 leased->prompts(0).prompt_tokens().end()),
            (std::vector<int32_t>{7, 4, 11, 11, 14}));
}

TEST_F(CoordinatorTest, ChatPromptsAreRenderedWithTheTemplateAndTokenised) {
  auto c = Open();
  v1::SubmitPromptSetRequest r = Request(1);
  v1::Chat* chat = r.mutable_prompts(0)->mutable_chat();
  v1::ChatMessage* system = chat->add_messages();
  system->set_role("system");
  system->set_content("be");
  v1::ChatMessage* user = chat->add_messages();
  user->set_role("user");
  user->set_content("hi");
  ASSERT_TRUE(c->Submit(r).ok());
  const std::string actor = c->RegisterActor("a")->actor_id();
  auto leased = c->Lease(LeaseOf(actor, 1));
  ASSERT_TRUE(leased.ok());
  ASSERT_EQ(leased->prompts_size(), 1);
  // "be" + "x" + "hi" + "x" in LettersCodec's template.
  EXPECT_EQ(std::vector<int32_t>(leased->prompts(0).prompt_tokens().begin(),
                                 leased->prompts(0).prompt_tokens().end()),
            (std::vector<int32_t>{1, 4, 23, 7, 8, 23}));
  // Malformed chats name the field.
  v1::SubmitPromptSetRequest bad = Request(1);
  bad.mutable_prompts(0)->mutable_chat();
  EXPECT_NE(c->Submit(bad).status().message().find("prompts[0].chat.messages"),
            absl::string_view::npos);
  *bad.mutable_prompts(0)->mutable_chat()->add_messages() = *user;
  bad.mutable_prompts(0)->mutable_chat()->set_tools_json("{\"not\": \"a list\"}");
  EXPECT_NE(c->Submit(bad).status().message().find("prompts[0].chat.tools_json: expected a JSON "
                                                   "array"),
            absl::string_view::npos);
}

// 100,000 '[' then as many ']' (200 KB, under the prompt cap) in tools_json or
// template_kwargs_json overflowed the coordinator's stack while the prompt set was validated, for
// any client, again after every restart. Now it is refused naming the field, and the coordinator
// goes on accepting.
TEST_F(CoordinatorTest,
       ADeeplyNestedToolsOrKwargsJsonIsRefusedNamingTheFieldAndTheCoordinatorGoesOn) {
  auto c = Open();
  const std::string deep = std::string(100'000, '[') + std::string(100'000, ']');
  const std::string deep_object = [] {
    std::string s;
    for (int i = 0; i < 100'000; ++i) s += R"({"a":)";
    return s + "1" + std::string(100'000, '}');
  }();
  struct Case {
    std::string tools, kwargs, field;
  };
  for (const Case& k : {Case{deep, "", "prompts[0].chat.tools_json"},
                        Case{"", deep_object, "prompts[0].chat.template_kwargs_json"}}) {
    v1::SubmitPromptSetRequest r = Request(1);
    v1::Chat* chat = r.mutable_prompts(0)->mutable_chat();
    v1::ChatMessage* user = chat->add_messages();
    user->set_role("user");
    user->set_content("hi");
    chat->set_tools_json(k.tools);
    chat->set_template_kwargs_json(k.kwargs);
    const absl::Status refused = c->Submit(r).status();
    EXPECT_TRUE(absl::IsInvalidArgument(refused)) << refused;
    EXPECT_NE(refused.message().find(k.field + ": expected JSON nested at most 64 deep"),
              absl::string_view::npos)
        << refused;
  }
  EXPECT_TRUE(c->Submit(Request(1)).ok());
}

TEST_F(CoordinatorTest, WithoutModelTextOnlyTokenPromptsAreAccepted) {
  config_.text = nullptr;
  auto c = Open();
  v1::SubmitPromptSetRequest r = Request(1);
  r.mutable_prompts(0)->set_text("hello");
  EXPECT_NE(c->Submit(r).status().message().find(
                "prompts[0].text: expected token ids (this model has no tokenizer), found text"),
            absl::string_view::npos);
  EXPECT_TRUE(c->Submit(Request(1)).ok());
}

TEST_F(CoordinatorTest, AbsentStopIdsAreTheModelsAndGivenOnesAreKept) {
  auto c = Open();
  ASSERT_TRUE(c->Submit(Request(1)).ok());
  v1::SubmitPromptSetRequest own = Request(1);
  own.mutable_sampling()->add_stop_token_ids(3);
  ASSERT_TRUE(c->Submit(own).ok());
  const std::string actor = c->RegisterActor("a")->actor_id();
  auto leased = c->Lease(LeaseOf(actor, 2));
  ASSERT_TRUE(leased.ok());
  ASSERT_EQ(leased->prompts_size(), 2);
  EXPECT_EQ(std::vector<int32_t>(leased->prompts(0).sampling().stop_token_ids().begin(),
                                 leased->prompts(0).sampling().stop_token_ids().end()),
            std::vector<int32_t>{25});
  EXPECT_EQ(std::vector<int32_t>(leased->prompts(1).sampling().stop_token_ids().begin(),
                                 leased->prompts(1).sampling().stop_token_ids().end()),
            std::vector<int32_t>{3});
}

TEST_F(CoordinatorTest, SampleTextsReachWatchersThatAskButNotTheLog) {
  config_.max_text_bytes_per_set = 10;
  auto c = Open();
  auto submitted = c->Submit(Request(2));
  ASSERT_TRUE(submitted.ok());
  const std::string id = submitted->prompt_set_id();
  size_t with = 0, without = 0;
  bool finished = false;
  ASSERT_TRUE(c->WatchEvents(id, &with, absl::ZeroDuration(), &finished, true).ok());
  ASSERT_TRUE(c->WatchEvents(id, &without, absl::ZeroDuration(), &finished, false).ok());
  const std::string actor = c->RegisterActor("a")->actor_id();
  auto leased = c->Lease(LeaseOf(actor, 2));
  ASSERT_TRUE(leased.ok());
  for (const auto& p : leased->prompts()) {
    v1::CompleteRequest done = Done(actor, p);
    done.mutable_result()->add_texts("abcd");
    done.mutable_result()->add_texts("efgh");
    ASSERT_TRUE(c->Complete(done).ok());
  }
  auto groups = [](const std::vector<v1::PromptSetEvent>& events) {
    std::vector<v1::GroupResult> out;
    for (const auto& e : events) {
      if (e.has_group()) out.push_back(e.group());
    }
    return out;
  };
  auto seen = c->WatchEvents(id, &with, absl::Seconds(1), &finished, true);
  ASSERT_TRUE(seen.ok());
  const std::vector<v1::GroupResult> texts = groups(*seen);
  ASSERT_EQ(texts.size(), 2u);
  // 16 bytes of texts over a bound of 10: the first group's were dropped, and say so.
  EXPECT_EQ(texts[0].texts_size(), 0);
  EXPECT_TRUE(texts[0].texts_dropped());
  ASSERT_EQ(texts[1].texts_size(), 2);
  EXPECT_EQ(texts[1].texts(1), "efgh");
  auto plain = c->WatchEvents(id, &without, absl::Seconds(1), &finished, false);
  ASSERT_TRUE(plain.ok());
  for (const v1::GroupResult& g : groups(*plain)) EXPECT_EQ(g.texts_size(), 0);
  // The log holds no texts: a restarted coordinator has the groups, not their texts.
  std::ifstream log(config_.log_path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
  EXPECT_EQ(bytes.find("efgh"), std::string::npos);
  EXPECT_EQ(bytes.find("abcd"), std::string::npos);
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
    const std::string actor = c->RegisterActor("a")->actor_id();
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
  const std::string actor = c->RegisterActor("b")->actor_id();
  auto leased = c->Lease(LeaseOf(actor, 10));
  ASSERT_EQ(leased->prompts_size(), 3);
  for (const auto& p : leased->prompts()) ASSERT_TRUE(c->Complete(Done(actor, p)).ok());
  EXPECT_EQ(c->Get(id)->state(), v1::PROMPT_SET_STATE_DONE);
}

TEST_F(CoordinatorTest, GroupsAreCheckedAgainstTheOpenLeaseOfTheirPrompt) {
  auto c = Open();
  const std::string id = c->Submit(Request(2))->prompt_set_id();
  const std::string actor = c->RegisterActor("a")->actor_id();
  auto leased = c->Lease(LeaseOf(actor, 1));
  ASSERT_EQ(leased->prompts_size(), 1);
  v1::CheckGroupRequest check;
  check.set_prompt_set_id(id);
  check.set_prompt_index(leased->prompts(0).prompt_index());
  check.set_group_id(GroupIdOfLease(leased->prompts(0).lease_id()));
  EXPECT_TRUE(c->CheckGroup(check).ok());
  check.set_group_id(check.group_id() + 1);  // a guessed id
  EXPECT_EQ(c->CheckGroup(check).code(), absl::StatusCode::kFailedPrecondition);
  check.set_group_id(GroupIdOfLease(leased->prompts(0).lease_id()));
  check.set_prompt_index(1);  // not leased
  EXPECT_EQ(c->CheckGroup(check).code(), absl::StatusCode::kFailedPrecondition);
  check.set_prompt_set_id("ps-unknown");
  EXPECT_EQ(c->CheckGroup(check).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(c->Stats().rejected_groups, 3);
}

TEST_F(CoordinatorTest, RemoteRewardsMayNameOnlyAllowedAddresses) {
  config_.validate_reward = [](const v1::RewardSpec&) { return absl::OkStatus(); };
  config_.reward_addresses = {"verifier:50071"};
  auto c = Open();
  v1::SubmitPromptSetRequest r = Request(1);
  r.mutable_reward()->set_name("remote");
  (*r.mutable_reward()->mutable_params())["address"] = "169.254.169.254:80";
  const absl::Status refused = c->Submit(r).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.message().find("reward.params.address: expected one of "
                                   "coordinator.reward_addresses: verifier:50071, found "
                                   "'169.254.169.254:80'"),
            absl::string_view::npos)
      << refused;
  (*r.mutable_reward()->mutable_params())["address"] = "verifier:50071";
  EXPECT_TRUE(c->Submit(r).ok());
}

TEST_F(CoordinatorTest, EveryFieldIsBounded) {
  config_.max_prompts_per_set = 3;
  auto c = Open();
  EXPECT_EQ(c->Submit(Request(4)).status().code(), absl::StatusCode::kResourceExhausted);
  struct Case {
    std::function<void(v1::SubmitPromptSetRequest&)> mutate;
    absl::string_view field;
  };
  const std::vector<Case> cases = {
      {[](auto& r) { r.set_name(std::string(300, 'n')); }, "name: expected at most 256"},
      {[](auto& r) { r.set_idempotency_key(std::string(300, 'k')); }, "idempotency_key"},
      {[](auto& r) {
         for (int i = 0; i < 20; ++i) (*r.mutable_reward()->mutable_params())[absl::StrCat(i)] = "";
       },
       "reward.params: expected at most 16"},
      {[](auto& r) { r.mutable_prompts(0)->set_text(std::string(2 << 20, 'a')); },
       "prompts[0]: expected at most 1048576"},
      {[](auto& r) {
         for (int i = 0; i < 65; ++i) r.mutable_sampling()->add_stop_token_ids(1);
       },
       "sampling.stop_token_ids: expected at most 64"},
  };
  for (const Case& k : cases) {
    v1::SubmitPromptSetRequest r = Request(1);
    k.mutate(r);
    const absl::Status status = c->Submit(r).status();
    EXPECT_EQ(status.code(), kInvalid) << status;
    EXPECT_NE(status.message().find(k.field), absl::string_view::npos) << status;
  }
  EXPECT_TRUE(c->List().empty());
}

TEST_F(CoordinatorTest, ListingIsPaginated) {
  auto c = Open();
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(c->Submit(Request(1)).ok());
  v1::ListPromptSetsRequest request;
  request.set_page_size(2);
  std::vector<std::string> ids;
  for (int pages = 1;; ++pages) {
    auto page = c->ListPage(request);
    ASSERT_TRUE(page.ok()) << page.status();
    for (const auto& s : page->prompt_sets()) ids.push_back(s.prompt_set_id());
    if (page->next_page_token().empty()) {
      EXPECT_EQ(pages, 3);
      break;
    }
    request.set_page_token(page->next_page_token());
  }
  ASSERT_EQ(ids.size(), 5u);
  EXPECT_EQ(ids.front(), c->List().front().prompt_set_id());
  request.set_page_size(5000);
  EXPECT_EQ(c->ListPage(request).status().code(), kInvalid);
  request.set_page_size(1);
  request.set_page_token("not-a-token");
  EXPECT_EQ(c->ListPage(request).status().code(), kInvalid);
}

TEST_F(CoordinatorTest, StatsCountThrottledLeaseRequestsAndLeasesPerActor) {
  config_.max_lag = 0;
  config_.groups_per_step = 3;  // at most 3 groups ahead of the learner
  auto c = Open();
  c->Submit(Request(5)).IgnoreError();
  const std::string a = c->RegisterActor("actors-x7k2p")->actor_id();
  const std::string b = c->RegisterActor("actors-q4m8z")->actor_id();
  EXPECT_EQ(c->Lease(LeaseOf(a, 2))->prompts_size(), 2);  // within the budget
  EXPECT_EQ(c->Stats().lease_requests_throttled, 0);
  EXPECT_EQ(c->Lease(LeaseOf(b, 2))->prompts_size(), 1);  // cut to the budget's last group
  EXPECT_EQ(c->Lease(LeaseOf(b, 2))->prompts_size(), 0);  // refused: 2 prompts still pending
  const CoordinatorStats stats = c->Stats();
  EXPECT_EQ(stats.lease_requests_throttled, 2);
  EXPECT_EQ(stats.prompts_leased,
            (std::map<std::string, int64_t>{{"actors-x7k2p", 2}, {"actors-q4m8z", 1}}));
}

TEST_F(CoordinatorTest, CancelledSetsAreNotLeased) {
  auto c = Open();
  const std::string id = c->Submit(Request(3))->prompt_set_id();
  auto cancelled = c->Cancel(id);
  ASSERT_TRUE(cancelled.ok());
  EXPECT_EQ(cancelled->state(), v1::PROMPT_SET_STATE_CANCELLED);
  const std::string actor = c->RegisterActor("a")->actor_id();
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
  const std::string actor = c->RegisterActor("a")->actor_id();
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

// Complete over gRPC is answered by the prompt log's flusher (CoordinatorServer): an accepted
// reply arrives with its group on disk and fsync'd; a repeat is not accepted; a refusal carries
// its reason, as from the synchronous path.
TEST_F(CoordinatorTest, OverGrpcACompletionIsAnsweredOnceDurableAndRefusalsKeepTheirReason) {
  auto c = Open();
  auto server = CoordinatorServer::Start(c.get(), "127.0.0.1:0");
  ASSERT_TRUE(server.ok()) << server.status();
  auto actors = v1::ActorControl::NewStub(
      grpc::CreateCustomChannel(absl::StrCat("127.0.0.1:", (*server)->port()),
                                grpc::InsecureChannelCredentials(), rpc::ChannelArgs(64 << 20)));
  ASSERT_TRUE(c->Submit(Request(2)).ok());
  const std::string actor = c->RegisterActor("a")->actor_id();
  grpc::ClientContext lc;
  v1::LeaseResponse leased;
  ASSERT_TRUE(actors->LeasePrompts(&lc, LeaseOf(actor, 1), &leased).ok());
  ASSERT_EQ(leased.prompts_size(), 1);
  const int64_t fsyncs = c->LogStats().fsyncs;

  grpc::ClientContext cc;
  v1::CompleteResponse reply;
  ASSERT_TRUE(actors->Complete(&cc, Done(actor, leased.prompts(0)), &reply).ok());
  EXPECT_TRUE(reply.accepted());
  EXPECT_GT(c->LogStats().fsyncs, fsyncs);
  EXPECT_EQ(static_cast<int64_t>(std::filesystem::file_size(config_.log_path)), c->LogStats().bytes)
      << "the group was written before the reply";

  grpc::ClientContext again;
  ASSERT_TRUE(actors->Complete(&again, Done(actor, leased.prompts(0)), &reply).ok());
  EXPECT_FALSE(reply.accepted()) << "a repeat is not counted twice";

  grpc::ClientContext unknown;
  v1::LeasedPrompt bogus = leased.prompts(0);
  bogus.set_lease_id("nope");
  const grpc::Status refused = actors->Complete(&unknown, Done(actor, bogus), &reply);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_NE(refused.error_message().find("unknown lease 'nope'"), std::string::npos);

  grpc::ClientContext stranger;
  const grpc::Status no_actor = actors->LeasePrompts(&stranger, LeaseOf("who", 1), &leased);
  EXPECT_FALSE(no_actor.ok());
  EXPECT_NE(no_actor.error_message().find("who"), std::string::npos) << no_actor.error_message();
}

TEST_F(CoordinatorTest, CompleteAsyncAnswersARefusalAtOnceAndAnAcceptanceOnceDurable) {
  auto c = Open();
  ASSERT_TRUE(c->Submit(Request(1)).ok());
  const std::string actor = c->RegisterActor("a")->actor_id();
  const v1::LeaseResponse leased = *c->Lease(LeaseOf(actor, 1));
  ASSERT_EQ(leased.prompts_size(), 1);

  v1::LeasedPrompt bogus = leased.prompts(0);
  bogus.set_lease_id("nope");
  bool refused_at_once = false;
  c->CompleteAsync(Done(actor, bogus), [&](absl::StatusOr<v1::CompleteResponse> r) {
    refused_at_once = absl::IsNotFound(r.status());
  });
  EXPECT_TRUE(refused_at_once);

  absl::StatusOr<v1::CompleteResponse> reply = absl::UnknownError("not called");
  bool was_called = false;
  std::mutex mu;
  std::condition_variable called;
  c->CompleteAsync(Done(actor, leased.prompts(0)), [&](absl::StatusOr<v1::CompleteResponse> r) {
    std::lock_guard<std::mutex> lock(mu);
    reply = std::move(r);
    was_called = true;
    called.notify_one();
  });
  {
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(called.wait_for(lock, std::chrono::seconds(30), [&] { return was_called; }));
  }
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_TRUE(reply->accepted());
  c.reset();
  c = Open();
  EXPECT_EQ(c->Get(leased.prompts(0).prompt_set_id())->prompts_done(), 1)
      << "acknowledged, hence in the log a restarted coordinator replays";
}

// A set of agentic episodes names its environment: a built-in one, or an address the operator
// allowed (coordinator.env_addresses); limits are checked naming the field, and the lease
// carries the environment with its defaults filled in.
TEST_F(CoordinatorTest, AnEnvironmentIsBuiltInOrAllowListedAndItsLimitsAreChecked) {
  config_.env_addresses = {"10.0.0.7:7000"};
  auto c = Open();
  auto submit = [&](const v1::EnvironmentSpec& env) {
    v1::SubmitPromptSetRequest r = Request(1);
    r.clear_reward();  // an episode's reward is its environment's
    *r.mutable_environment() = env;
    return c->Submit(r);
  };
  v1::EnvironmentSpec env;
  env.set_name("chess");
  EXPECT_TRUE(IsError(submit(env).status(), absl::StatusCode::kInvalidArgument,
                      {"environment.name", "found 'chess'"}));
  env.set_address("10.0.0.8:7000");
  EXPECT_TRUE(IsError(submit(env).status(), absl::StatusCode::kInvalidArgument,
                      {"environment.address: expected one of coordinator.env_addresses: "
                       "10.0.0.7:7000, found '10.0.0.8:7000'"}));
  env.set_address("");
  env.set_name("calculator");
  env.set_max_tokens_per_turn(9);
  EXPECT_TRUE(IsError(submit(env).status(), absl::StatusCode::kInvalidArgument,
                      {"environment.max_tokens_per_turn", "sampling.max_tokens (8)", "found 9"}));
  env.set_max_tokens_per_turn(0);
  ASSERT_TRUE(submit(env).ok());
  const std::string actor = c->RegisterActor("a")->actor_id();
  v1::LeaseRequest lease;
  lease.set_actor_id(actor);
  lease.set_max_prompts(1);
  const v1::LeaseResponse leased = *c->Lease(lease);
  ASSERT_EQ(leased.prompts_size(), 1);
  const v1::EnvironmentSpec& got = leased.prompts(0).environment();
  EXPECT_EQ(got.name(), "calculator");
  EXPECT_EQ(got.max_turns(), 8);
  EXPECT_EQ(got.max_tokens_per_turn(), 8);
  EXPECT_EQ(got.timeout_s(), 30);
}

}  // namespace
}  // namespace prl::coordinator
