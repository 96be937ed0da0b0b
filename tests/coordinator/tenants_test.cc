// Tenants through the coordinator (coordinator/tenants.h, coordinator/tenancy.cc): a tenant
// trains only the adapters its limits name, sees, watches and cancels only its own sets, uses
// and deletes only its own adapters, holds at most its quotas, and its idempotency keys are its
// own; the operator sees and may do everything.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_replace.h"
#include "tests/coordinator/coordinator_fixture.h"
#include "tests/status_testing.h"

namespace prl::coordinator {
namespace {

using ::prl::testing::IsError;
constexpr auto kDenied = absl::StatusCode::kPermissionDenied;
constexpr auto kNotFound = absl::StatusCode::kNotFound;
constexpr auto kExhausted = absl::StatusCode::kResourceExhausted;

class TenantsTest : public CoordinatorTest {
 protected:
  void SetUp() override {
    CoordinatorTest::SetUp();
    config_.adapters = true;
    config_.adapter_defaults.set_rank(8);
    config_.adapter_defaults.set_alpha(16);
    config_.adapter_defaults.add_target_modules("q_proj");
    TenantLimits a;
    a.adapters = {"a-*", "shared"};
    config_.tenants["team-a"] = a;
    TenantLimits b;
    b.adapters = {"b-*", "shared"};
    b.max_prompt_sets = 2;
    b.max_prompts_in_flight = 5;
    b.max_adapters = 1;
    config_.tenants["team-b"] = b;
  }
  static v1::SubmitPromptSetRequest For(const std::string& adapter, int prompts) {
    v1::SubmitPromptSetRequest r = Request(prompts);
    r.mutable_adapter()->set_name(adapter);
    return r;
  }
  const Caller kA{"team-a"}, kB{"team-b"}, kOperator{};
};

TEST_F(TenantsTest, ATenantTrainsOnlyTheAdaptersItsLimitsName) {
  auto c = Open();
  EXPECT_TRUE(c->Submit(For("a-math", 1), kA).ok());
  absl::Status other = c->Submit(For("b-math", 1), kA).status();
  EXPECT_TRUE(IsError(other, kDenied, {"adapter.name"}));
  EXPECT_TRUE(IsError(other, kDenied, {"coordinator.tenants.team-a.adapters"}));
  // A tenant trains adapters only; an unknown tenant may do nothing.
  EXPECT_TRUE(IsError(c->Submit(Request(1), kA).status(), absl::StatusCode::kInvalidArgument,
                      {"adapter.name"}));
  EXPECT_TRUE(IsError(c->Submit(For("a-x", 1), Caller{"team-z"}).status(), kDenied,
                      {"coordinator.tenants"}));
  // An adapter both may name belongs to whoever made it first.
  ASSERT_TRUE(c->Submit(For("shared", 1), kA).ok());
  // Another tenant's adapter gets the very error of a name the tenant may not train (its
  // existence is not revealed).
  const absl::Status taken = c->Submit(For("shared", 1), kB).status();
  const absl::Status never = c->Submit(For("never", 1), kB).status();
  EXPECT_TRUE(IsError(taken, kDenied, {"adapter.name: tenant 'team-b' may train the adapters"}));
  EXPECT_EQ(taken.code(), never.code());
  EXPECT_EQ(absl::StrReplaceAll(never.message(), {{"'never'", "'shared'"}}), taken.message());
  // The operator may train any.
  EXPECT_TRUE(c->Submit(For("shared", 1), kOperator).ok());
  EXPECT_EQ(c->ListAdapters(kA).adapters_size(), 2);
  EXPECT_EQ(c->ListAdapters(kB).adapters_size(), 0);
  EXPECT_EQ(c->ListAdapters(kOperator).adapters_size(), 2);
  EXPECT_EQ(c->ListAdapters(kOperator).adapters(0).tenant(), "team-a");
}

TEST_F(TenantsTest, ATenantSeesWatchesAndCancelsOnlyItsOwnSets) {
  auto c = Open();
  const std::string a_set = c->Submit(For("a-math", 2), kA)->prompt_set_id();
  const std::string b_set = c->Submit(For("b-code", 2), kB)->prompt_set_id();
  EXPECT_TRUE(c->Get(a_set, kA).ok());
  EXPECT_TRUE(IsError(c->Get(a_set, kB).status(), kNotFound, {a_set}));
  EXPECT_TRUE(IsError(c->Cancel(a_set, kB).status(), kNotFound, {a_set}));
  size_t cursor = 0;
  bool finished = false;
  EXPECT_TRUE(
      IsError(c->WatchEvents(a_set, &cursor, absl::ZeroDuration(), &finished, false, kB).status(),
              kNotFound, {a_set}));
  ASSERT_EQ(c->List(kB).size(), 1u);
  EXPECT_EQ(c->List(kB)[0].prompt_set_id(), b_set);
  EXPECT_EQ(c->List(kOperator).size(), 2u);
  v1::ListPromptSetsRequest page;
  page.set_page_size(1);
  absl::StatusOr<v1::ListPromptSetsResponse> listed = c->ListPage(page, kB);
  ASSERT_TRUE(listed.ok());
  ASSERT_EQ(listed->prompt_sets_size(), 1);
  EXPECT_EQ(listed->prompt_sets(0).prompt_set_id(), b_set);
  // Pages count only the caller's sets: B's one set after A's is its page 0, with no next page,
  // and a token past B's sets names B's count, not everyone's.
  EXPECT_EQ(listed->next_page_token(), "");
  page.set_page_token("2");
  EXPECT_TRUE(IsError(c->ListPage(page, kB).status(), absl::StatusCode::kInvalidArgument,
                      {"page_token: expected at most 1, found 2"}));
  page.set_page_token("");
  listed = c->ListPage(page, kOperator);
  ASSERT_TRUE(listed.ok());
  EXPECT_EQ(listed->next_page_token(), "1");
  EXPECT_EQ(c->Get(a_set, kA)->state(), v1::PROMPT_SET_STATE_RUNNING);  // B's cancel did nothing
  EXPECT_EQ(c->Cancel(b_set, kB)->state(), v1::PROMPT_SET_STATE_CANCELLED);
  // Adapters: another tenant's is not found, its own is deleted.
  EXPECT_TRUE(IsError(c->DeleteAdapter("a-math", kB).status(), kNotFound, {"a-math"}));
  EXPECT_TRUE(c->DeleteAdapter("b-code", kB).ok());
  EXPECT_EQ(c->ListAdapters(kOperator).adapters_size(), 1);
}

// Actors dial a set's agent or environment address and present the credential configured for
// it: a tenant names only the operator's shared addresses and its own, never another tenant's
// (whose addresses its errors do not show); the operator may name any.
TEST_F(TenantsTest, ATenantNamesOnlySharedAddressesAndItsOwn) {
  config_.agent_addresses = {"10.0.0.1:7000"};
  config_.env_addresses = {"10.0.0.1:8000"};
  config_.tenants["team-a"].agent_addresses = {"10.0.0.2:7000"};
  config_.tenants["team-a"].env_addresses = {"10.0.0.2:8000"};
  config_.tenants["team-b"].agent_addresses = {"10.0.0.3:7000"};
  config_.tenants["team-b"].max_prompt_sets = 0;
  auto c = Open();
  const auto agent_set = [](const std::string& adapter, const std::string& address) {
    v1::SubmitPromptSetRequest r = For(adapter, 1);
    r.clear_reward();
    r.mutable_agent()->set_name("calc");
    r.mutable_agent()->set_address(address);
    return r;
  };
  const auto env_set = [](const std::string& adapter, const std::string& address) {
    v1::SubmitPromptSetRequest r = For(adapter, 1);
    r.clear_reward();
    r.mutable_environment()->set_name("calc");
    r.mutable_environment()->set_address(address);
    return r;
  };
  EXPECT_TRUE(c->Submit(agent_set("a-1", "10.0.0.1:7000"), kA).ok()) << "shared";
  EXPECT_TRUE(c->Submit(agent_set("a-2", "10.0.0.2:7000"), kA).ok()) << "its own";
  EXPECT_TRUE(c->Submit(env_set("a-3", "10.0.0.2:8000"), kA).ok()) << "its own";
  const absl::Status foreign = c->Submit(agent_set("a-4", "10.0.0.3:7000"), kA).status();
  EXPECT_TRUE(IsError(foreign, absl::StatusCode::kInvalidArgument,
                      {"agent.address: expected one of coordinator.agent_addresses or "
                       "coordinator.tenants.team-a.agent_addresses: 10.0.0.1:7000, 10.0.0.2:7000",
                       "found '10.0.0.3:7000'"}));
  EXPECT_EQ(foreign.message().find("10.0.0.3:7000,"), std::string::npos) << foreign;
  EXPECT_FALSE(c->Submit(env_set("b-1", "10.0.0.2:8000"), kB).ok()) << "team-a's environment";
  EXPECT_TRUE(c->Submit(agent_set("b-1", "10.0.0.3:7000"), kB).ok());
  EXPECT_TRUE(c->Submit(agent_set("op", "10.0.0.3:7000"), kOperator).ok()) << "the operator";
}

TEST_F(TenantsTest, IdempotencyKeysArePerTenant) {
  auto c = Open();
  v1::SubmitPromptSetRequest a = For("a-math", 1), b = For("b-code", 1);
  a.set_idempotency_key("run-1");
  b.set_idempotency_key("run-1");
  const absl::StatusOr<v1::SubmitPromptSetResponse> first = c->Submit(a, kA);
  const absl::StatusOr<v1::SubmitPromptSetResponse> other = c->Submit(b, kB);
  ASSERT_TRUE(first.ok() && other.ok());
  EXPECT_FALSE(other->duplicate());  // B's key is B's: never A's set
  EXPECT_NE(other->prompt_set_id(), first->prompt_set_id());
  const absl::StatusOr<v1::SubmitPromptSetResponse> again = c->Submit(a, kA);
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(again->duplicate());
  EXPECT_EQ(again->prompt_set_id(), first->prompt_set_id());
}

TEST_F(TenantsTest, ATenantBeyondAQuotaIsResourceExhaustedNamingIt) {
  auto c = Open();
  ASSERT_TRUE(c->Submit(For("b-code", 2), kB).ok());
  // Prompts pending or in flight: 2 + 4 > 5.
  absl::Status prompts = c->Submit(For("b-code", 4), kB).status();
  EXPECT_TRUE(IsError(prompts, kExhausted, {"coordinator.tenants.team-b.max_prompts_in_flight"}));
  // Adapters: one.
  EXPECT_TRUE(IsError(c->Submit(For("b-other", 1), kB).status(), kExhausted,
                      {"coordinator.tenants.team-b.max_adapters"}));
  // Running sets: two.
  ASSERT_TRUE(c->Submit(For("b-code", 1), kB).ok());
  const std::string third_refused = "coordinator.tenants.team-b.max_prompt_sets";
  EXPECT_TRUE(IsError(c->Submit(For("b-code", 1), kB).status(), kExhausted, {third_refused}));
  // Another tenant is not held back by B's quotas.
  EXPECT_TRUE(c->Submit(For("a-math", 4), kA).ok());
  // A set done or cancelled frees its place.
  const std::string first = c->List(kB).front().prompt_set_id();
  ASSERT_TRUE(c->Cancel(first, kB).ok());
  EXPECT_TRUE(c->Submit(For("b-code", 1), kB).ok());
  // The operator holds no quota.
  EXPECT_TRUE(c->Submit(For("b-op", 9), kOperator).ok());
}

TEST(TenantLimitsTest, BadLimitsNameTheKey) {
  TenantLimits limits;
  limits.adapters = {"Bad Name"};
  EXPECT_TRUE(IsError(ValidateTenantLimits(limits, "coordinator.tenants.t"),
                      absl::StatusCode::kInvalidArgument, {"coordinator.tenants.t.adapters[0]"}));
  limits.adapters = {"*", "a-*", "exact"};
  EXPECT_TRUE(ValidateTenantLimits(limits, "t").ok());
  limits.max_prompts_in_flight = -1;
  EXPECT_TRUE(IsError(ValidateTenantLimits(limits, "coordinator.tenants.t"),
                      absl::StatusCode::kInvalidArgument,
                      {"coordinator.tenants.t.max_prompts_in_flight"}));
}

// coordinator.tenants_file: read into each tenant's limits; a bad key, value or shape is an
// error naming it.
TEST(TenantLimitsTest, TheTenantsFileIsReadStrictly) {
  const std::string path = absl::StrCat(::testing::TempDir(), "/tenants_", getpid(), ".json");
  const auto read = [&](const std::string& text) {
    std::ofstream(path) << text;
    return ReadTenantsFile(path);
  };
  absl::StatusOr<std::map<std::string, TenantLimits>> ok =
      read(R"({"team-a": {"adapters": ["a-*"], "max_prompt_sets": 3, "max_adapters": 2},
               "team-b": {"adapters": ["b-math"]}})");
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->at("team-a").adapters, std::vector<std::string>{"a-*"});
  EXPECT_EQ(ok->at("team-a").max_prompt_sets, 3);
  EXPECT_EQ(ok->at("team-a").max_adapters, 2);
  EXPECT_EQ(ok->at("team-b").max_prompts_in_flight, 0);
  const auto refused = [&](const std::string& text, const std::string& field) {
    EXPECT_TRUE(IsError(read(text).status(), absl::StatusCode::kInvalidArgument, {field})) << text;
  };
  refused(R"(["team-a"])", "expected a JSON object");
  refused(R"({"team-a": {"max_sets": 1}})", "coordinator.tenants.team-a.max_sets");
  refused(R"({"team-a": {"max_adapters": "two"}})", "coordinator.tenants.team-a.max_adapters");
  refused(R"({"team-a": {"adapters": "a-*"}})", "coordinator.tenants.team-a.adapters");
  refused(R"({"team-a": {"adapters": ["Bad Name"]}})", "coordinator.tenants.team-a.adapters[0]");
  std::remove(path.c_str());
  EXPECT_TRUE(IsError(ReadTenantsFile(path).status(), absl::StatusCode::kFailedPrecondition,
                      {"coordinator.tenants_file: cannot read"}));
}

}  // namespace
}  // namespace prl::coordinator
