// Environments over gRPC (env/environment_server.h, env/remote_environment.h): the built-in
// ones served and called over loopback, answers that break the protocol refused naming the
// field, transient failures retried with the same turn, and a server that is down reported
// naming its address.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>

#include "absl/strings/match.h"

#include "core/net_address.h"
#include "env/calculator.h"
#include "env/environment_server.h"
#include "env/guess_number.h"
#include "env/remote_environment.h"
#include "tests/env/env_testing.h"
#include "tests/status_testing.h"

namespace prl::env {
namespace {

using ::prl::testing::IsError;

RemoteEnvironmentOptions Options(int port) {
  RemoteEnvironmentOptions o;
  o.address = absl::StrCat("127.0.0.1:", port);
  o.retry.timeout = absl::Seconds(20);
  o.retry.initial_backoff = absl::Milliseconds(1);
  o.retry.max_backoff = absl::Milliseconds(10);
  return o;
}

using testing::Start;
using testing::Turn;

TEST(RemoteEnvironmentTest, BuiltInEnvironmentsServedByNameOverLoopback) {
  auto server = EnvironmentServer::Start({{"calculator", std::make_shared<CalculatorEnvironment>()},
                                          {"guess", std::make_shared<GuessNumberEnvironment>()}},
                                         {});
  ASSERT_TRUE(server.ok()) << server.status();
  auto env = RemoteEnvironment::Connect(Options((*server)->port()));
  ASSERT_TRUE(env.ok()) << env.status();
  ASSERT_TRUE((*env)->StartEpisode(Start("calculator", "c1", "391")).ok());
  ASSERT_TRUE((*env)->StartEpisode(Start("guess", "g1", "7")).ok());
  EXPECT_EQ((*env)->Step(Turn("c1", 0, "<calc>17*23</calc>", v1::TURN_END_STOP_STRING))
                ->messages(0)
                .content(),
            "391");
  EXPECT_EQ((*env)->Step(Turn("g1", 0, "3"))->messages(0).content(), "higher");
  EXPECT_EQ((*env)->Step(Turn("c1", 1, "391"))->episode_reward(), 1.0);
  EXPECT_TRUE(IsError((*env)->StartEpisode(Start("chess", "x", "1")).status(),
                      absl::StatusCode::kNotFound,
                      {"expected one of calculator, guess, found 'chess'"}));
}

// An environment whose answers the test sets, failing a number of calls first.
class ScriptedEnvironment final : public Environment {
 public:
  absl::StatusOr<v1::StartEpisodeResponse> StartEpisode(const v1::StartEpisodeRequest&) override {
    return start;
  }
  absl::StatusOr<v1::StepResponse> Step(const v1::StepRequest& request) override {
    turns_seen.push_back(request.turn_index());
    if (failures > 0) {
      --failures;
      return absl::UnavailableError("restarting");
    }
    return step;
  }
  absl::StatusOr<v1::EndEpisodeResponse> EndEpisode(const v1::EndEpisodeRequest&) override {
    return end;
  }
  v1::StartEpisodeResponse start;
  v1::StepResponse step;
  v1::EndEpisodeResponse end;
  std::atomic<int> failures{0};
  std::vector<int> turns_seen;
};

TEST(RemoteEnvironmentTest, TransientFailuresAreRetriedWithTheSameTurn) {
  auto scripted = std::make_shared<ScriptedEnvironment>();
  scripted->failures = 2;
  scripted->step.add_messages()->set_role("user");
  auto server = EnvironmentServer::Start({{"s", scripted}}, {});
  ASSERT_TRUE(server.ok()) << server.status();
  auto env = RemoteEnvironment::Connect(Options((*server)->port()));
  absl::StatusOr<v1::StepResponse> r = (*env)->Step(Turn("e", 5, "hi"));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(scripted->turns_seen, (std::vector<int>{5, 5, 5}));
}

TEST(RemoteEnvironmentTest, AnswersThatBreakTheProtocolAreRefusedNamingTheField) {
  auto scripted = std::make_shared<ScriptedEnvironment>();
  auto server = EnvironmentServer::Start({{"s", scripted}}, {});
  ASSERT_TRUE(server.ok()) << server.status();
  auto env = RemoteEnvironment::Connect(Options((*server)->port()));
  scripted->step.add_messages()->set_role("assistant");
  EXPECT_TRUE(IsError((*env)->Step(Turn("e", 0, "")).status(), absl::StatusCode::kInvalidArgument,
                      {"environment at 127.0.0.1:", "Step turn 0 of episode 'e'",
                       "StepResponse.messages[0].role: expected \"user\", \"tool\" or \"system\", "
                       "found \"assistant\""}));
  scripted->step.Clear();
  scripted->step.set_done(true);
  scripted->step.set_episode_reward(NAN);
  EXPECT_TRUE(IsError((*env)->Step(Turn("e", 1, "")).status(), absl::StatusCode::kInvalidArgument,
                      {"StepResponse.episode_reward: expected a finite number when done"}));
  scripted->start.add_stop_strings(std::string(65, 'x'));
  EXPECT_TRUE(IsError((*env)->StartEpisode(Start("", "e", "")).status(),
                      absl::StatusCode::kInvalidArgument,
                      {"StartEpisodeResponse.stop_strings[0]: expected 1 to 64 bytes", "65 bytes"}));
  scripted->end.set_episode_reward(INFINITY);
  v1::EndEpisodeRequest end;
  end.set_episode_id("e");
  EXPECT_TRUE(IsError((*env)->EndEpisode(end).status(), absl::StatusCode::kInvalidArgument,
                      {"EndEpisodeResponse.episode_reward"}));
}

TEST(RemoteEnvironmentTest, AServerThatIsDownIsReportedNamingItsAddressAfterTheRetries) {
  RemoteEnvironmentOptions o = Options(*PickFreePort());
  o.retry.timeout = absl::Seconds(2);
  o.retry.max_attempts = 3;
  auto env = RemoteEnvironment::Connect(o);
  ASSERT_TRUE(env.ok());
  const absl::Status s = (*env)->Step(Turn("e", 0, "")).status();
  EXPECT_TRUE(IsError(s, absl::StatusCode::kUnavailable, {o.address, "Step turn 0"})) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "attempts")) << s;
  o.retry.max_attempts = 0;
  EXPECT_TRUE(IsError(RemoteEnvironment::Connect(o).status(), absl::StatusCode::kInvalidArgument,
                      {"environment: max_attempts: expected >= 1, found 0"}));
}

}  // namespace
}  // namespace prl::env
