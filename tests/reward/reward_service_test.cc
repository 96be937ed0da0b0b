// RemoteReward against a RewardServer on loopback: results in order, transient failures
// retried within the budget, persistent ones failing the whole group, malformed responses
// rejected naming the sample, and a down server reported as UNAVAILABLE.
#include "reward/reward_service.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "tests/status_testing.h"

namespace prl::testing {
namespace {

using reward::RemoteReward;
using reward::RemoteRewardOptions;
using reward::RewardInput;
using reward::RewardResult;
using reward::RewardServer;

std::unique_ptr<RewardServer> Serve(reward::RewardCallback callback) {
  reward::RewardServerOptions options;
  options.address = "127.0.0.1:0";
  absl::StatusOr<std::unique_ptr<RewardServer>> server =
      RewardServer::Start(std::move(callback), options);
  EXPECT_TRUE(server.ok()) << server.status();
  return std::move(server).value();
}

std::unique_ptr<RemoteReward> Client(int port, int attempts = 3,
                                     absl::Duration timeout = absl::Seconds(10)) {
  RemoteRewardOptions options;
  options.address = absl::StrCat("127.0.0.1:", port);
  options.max_attempts = attempts;
  options.timeout = timeout;
  options.initial_backoff = absl::Milliseconds(10);
  options.max_backoff = absl::Milliseconds(40);
  return *RemoteReward::Connect(options);
}

std::vector<RewardInput> Group(int n, uint64_t group_id) {
  std::vector<RewardInput> group(n);
  for (int i = 0; i < n; ++i) {
    group[i].prompt = "1+2=";
    group[i].completion = absl::StrCat(i);
    group[i].reference = "3";
    group[i].prompt_tokens = {1, 4, 13, 5, 16};
    group[i].completion_tokens = {3 + i, 2};
    group[i].group_id = group_id;
  }
  return group;
}

// Reward = the completion's number, a component echoing the token count.
absl::StatusOr<std::vector<RewardResult>> Echo(absl::Span<const RewardInput> in) {
  std::vector<RewardResult> out(in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    out[i].reward = std::stod(in[i].completion);
    out[i].components["tokens"] = static_cast<double>(in[i].completion_tokens.size());
    out[i].components["group"] = static_cast<double>(in[i].group_id);
  }
  return out;
}

TEST(RewardServiceTest, ScoresArriveInRequestOrderWithComponents) {
  auto server = Serve(Echo);
  auto client = Client(server->port());
  const std::vector<RewardInput> group = Group(8, 42);
  absl::StatusOr<std::vector<RewardResult>> results = client->ScoreBatch(group);
  ASSERT_TRUE(results.ok()) << results.status();
  ASSERT_EQ(results->size(), 8u);
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ((*results)[i].reward, i);
    EXPECT_EQ((*results)[i].components.at("tokens"), 2.0);
    EXPECT_EQ((*results)[i].components.at("group"), 42.0);
  }
  absl::StatusOr<double> one = client->Score(group[5]);
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(*one, 5.0);
}

TEST(RewardServiceTest, TheRequestCarriesEveryField) {
  RewardInput seen;
  auto server = Serve([&seen](absl::Span<const RewardInput> in) {
    seen = in[0];
    return Echo(in);
  });
  auto client = Client(server->port());
  const std::vector<RewardInput> group = Group(1, 7);
  ASSERT_TRUE(client->ScoreBatch(group).ok());
  EXPECT_EQ(seen.prompt, group[0].prompt);
  EXPECT_EQ(seen.completion, group[0].completion);
  EXPECT_EQ(seen.reference, group[0].reference);
  EXPECT_EQ(seen.prompt_tokens, group[0].prompt_tokens);
  EXPECT_EQ(seen.completion_tokens, group[0].completion_tokens);
  EXPECT_EQ(seen.group_id, 7u);
}

TEST(RewardServiceTest, AServerThatFailsTwiceThenSucceedsIsRetried) {
  std::atomic<int> calls{0};
  auto server = Serve(
      [&calls](absl::Span<const RewardInput> in) -> absl::StatusOr<std::vector<RewardResult>> {
        if (++calls <= 2) return absl::UnavailableError("warming up");
        return Echo(in);
      });
  auto client = Client(server->port(), /*attempts=*/3);
  absl::StatusOr<std::vector<RewardResult>> results = client->ScoreBatch(Group(4, 1));
  ASSERT_TRUE(results.ok()) << results.status();
  EXPECT_EQ(results->size(), 4u);
  EXPECT_EQ(calls.load(), 3);
}

TEST(RewardServiceTest, AServerThatAlwaysFailsFailsTheGroupAfterAllAttempts) {
  std::atomic<int> calls{0};
  auto server =
      Serve([&calls](absl::Span<const RewardInput>) -> absl::StatusOr<std::vector<RewardResult>> {
        ++calls;
        return absl::InternalError("judge crashed");
      });
  auto client = Client(server->port(), /*attempts=*/4, absl::Seconds(5));
  const absl::Time start = absl::Now();
  const absl::Status s = client->ScoreBatch(Group(4, 17)).status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5)) << "within the call's budget";
  EXPECT_EQ(calls.load(), 4);
  EXPECT_TRUE(IsError(s, absl::StatusCode::kInternal,
                      {"4 of 4 attempts failed", "judge crashed", "batch of 4 samples", "group 17",
                       absl::StrCat("127.0.0.1:", server->port())}));
}

TEST(RewardServiceTest, NonTransientErrorsAreNotRetried) {
  std::atomic<int> calls{0};
  auto server =
      Serve([&calls](absl::Span<const RewardInput>) -> absl::StatusOr<std::vector<RewardResult>> {
        ++calls;
        return absl::InvalidArgumentError("sample 1 has no reference");
      });
  auto client = Client(server->port(), /*attempts=*/5);
  const absl::Status s = client->ScoreBatch(Group(2, 3)).status();
  EXPECT_EQ(calls.load(), 1);
  EXPECT_TRUE(IsError(s, absl::StatusCode::kInvalidArgument,
                      {"1 of 5 attempts", "not retried", "sample 1 has no reference"}));
}

TEST(RewardServiceTest, RetriesStopAtTheCallsDeadline) {
  absl::Notification release;
  auto server = Serve([&release](absl::Span<const RewardInput> in) {
    release.WaitForNotificationWithTimeout(absl::Seconds(10));  // hangs past the budget
    return Echo(in);
  });
  auto client = Client(server->port(), /*attempts=*/5, absl::Milliseconds(300));
  const absl::Time start = absl::Now();
  const absl::Status s = client->ScoreBatch(Group(2, 5)).status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(3)) << "the client did not wait for the server";
  release.Notify();
  EXPECT_TRUE(IsError(s, absl::StatusCode::kDeadlineExceeded, {"1 of 5 attempts", "group 5"})) << s;
}

TEST(RewardServiceTest, WrongRewardCountIsAnError) {
  auto server = Serve([](absl::Span<const RewardInput> in) {
    auto out = Echo(in);
    out->pop_back();
    return out;
  });
  auto client = Client(server->port());
  EXPECT_TRUE(IsError(client->ScoreBatch(Group(4, 2)).status(), absl::StatusCode::kInternal,
                      {"returned 3 rewards for 4 samples", "group 2"}));
}

TEST(RewardServiceTest, NonFiniteRewardIsAnErrorNamingTheSample) {
  auto server = Serve([](absl::Span<const RewardInput> in) {
    auto out = Echo(in);
    (*out)[2].reward = std::numeric_limits<double>::quiet_NaN();
    return out;
  });
  auto client = Client(server->port());
  EXPECT_TRUE(IsError(client->ScoreBatch(Group(4, 6)).status(), absl::StatusCode::kInternal,
                      {"non-finite reward (nan)", "sample 2 (group 6)"}));
  auto inf_component = Serve([](absl::Span<const RewardInput> in) {
    auto out = Echo(in);
    (*out)[1].components["format"] = std::numeric_limits<double>::infinity();
    return out;
  });
  auto client2 = Client(inf_component->port());
  EXPECT_TRUE(IsError(client2->ScoreBatch(Group(4, 6)).status(), absl::StatusCode::kInternal,
                      {"non-finite component 'format'", "sample 1 (group 6)"}));
}

TEST(RewardServiceTest, ADownServerIsUnavailableNamingTheAddress) {
  int port = 0;
  {
    auto server = Serve(Echo);  // bind a free port, then close it
    port = server->port();
  }
  auto client = Client(port, /*attempts=*/3, absl::Seconds(5));
  const absl::Time start = absl::Now();
  const absl::Status s = client->ScoreBatch(Group(2, 8)).status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_TRUE(
      IsError(s, absl::StatusCode::kUnavailable,
              {absl::StrCat("reward service at 127.0.0.1:", port), "3 of 3 attempts", "group 8"}));
}

TEST(RewardServiceTest, InvalidOptionsNameTheField) {
  RemoteRewardOptions options;
  EXPECT_TRUE(IsError(RemoteReward::Connect(options).status(), absl::StatusCode::kInvalidArgument,
                      {"address"}));
  options.address = "127.0.0.1:1";
  options.max_attempts = 0;
  EXPECT_TRUE(IsError(RemoteReward::Connect(options).status(), absl::StatusCode::kInvalidArgument,
                      {"max_attempts", "found 0"}));
  options.max_attempts = 1;
  options.timeout = absl::ZeroDuration();
  EXPECT_TRUE(IsError(RemoteReward::Connect(options).status(), absl::StatusCode::kInvalidArgument,
                      {"timeout", "found 0"}));
}

}  // namespace
}  // namespace prl::testing
