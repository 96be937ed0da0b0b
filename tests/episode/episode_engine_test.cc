// episode/episode_engine.h against environments served over gRPC on loopback: the first turn's
// budget within the episode's limits (truncation with EndEpisode where there is no room), a
// failed group handed back once with every one of its episodes told it was aborted, a hung
// environment that holds only its own calls, and an environment outage waited out (or, past
// the budget, failed).
#include "episode/episode_engine.h"

#include <gtest/gtest.h>

#include <thread>

#include "absl/strings/match.h"
#include "core/net_address.h"
#include "tests/episode/episode_testing.h"

namespace prl::episode {
namespace {

using testing::EpisodeGroup;
using testing::EpisodeLoop;
using testing::RemoteSpec;
using testing::ScriptedEnvironment;
using testing::ServedEnvironment;

ScriptedEnvironment::Script With(const std::function<void(ScriptedEnvironment::Script&)>& set) {
  ScriptedEnvironment::Script script;
  set(script);
  return script;
}

// Of a 64-token context, the prompt (8) and a long first observation leave fewer tokens than a
// turn's budget: the first turn gets what is left.
TEST(EpisodeEngineTest, TheFirstTurnIsCappedByTheContext) {
  ServedEnvironment served = ServedEnvironment::Start(
      With([](ScriptedEnvironment::Script& s) { s.observation = std::string(53, '+'); }));
  v1::EnvironmentSpec spec = RemoteSpec(served.address);
  spec.set_max_tokens_per_turn(8);
  EpisodeLoop loop({}, /*context=*/64);
  ASSERT_TRUE(loop.episodes().Add(EpisodeGroup("g", spec)).ok());
  ASSERT_TRUE(loop.RunToEnd());
  ASSERT_TRUE(loop.failed().empty()) << loop.failed()[0].why;
  ASSERT_EQ(loop.finished().size(), 1u);
  const FinishedGroup& g = loop.finished()[0];
  EXPECT_EQ(g.output.prompt.size(), 8u + 54u);  // the prompt, the observation and its newline
  const std::vector<v1::StepRequest> steps = served.env->steps();
  ASSERT_FALSE(steps.empty());
  EXPECT_LE(steps[0].token_ids_size(), 64 - 62);
  for (const SampleOutput& s : g.output.samples) EXPECT_LE(s.tokens.size(), 2u);
}

// No room at all: nothing could be trained; the group fails naming the sizes (its episodes are
// told), rather than training an empty turn or cutting the observation.
TEST(EpisodeEngineTest, AFirstPromptWithNoRoomForATurnFailsNamingTheSizes) {
  ServedEnvironment served = ServedEnvironment::Start(
      With([](ScriptedEnvironment::Script& s) { s.observation = std::string(60, '+'); }));
  EpisodeLoop loop({}, /*context=*/64);
  ASSERT_TRUE(loop.episodes().Add(EpisodeGroup("g", RemoteSpec(served.address))).ok());
  ASSERT_TRUE(loop.RunToEnd());
  ASSERT_EQ(loop.failed().size(), 1u);
  EXPECT_TRUE(absl::IsFailedPrecondition(loop.failed()[0].why)) << loop.failed()[0].why;
  EXPECT_NE(loop.failed()[0].why.message().find("(69 tokens) leave no room for a model turn "
                                                "(context 64)"),
            std::string::npos)
      << loop.failed()[0].why;
  served.env->WaitUntil([](const ScriptedEnvironment& e) { return e.ended_locked() == 2; });
  for (const auto& e : served.env->ended()) EXPECT_TRUE(e.aborted) << e.episode_id;
  EXPECT_TRUE(served.env->steps().empty());
}

// Both samples' first turns fail (a non-transient error): the group is handed back failed
// once, and each episode hears EndEpisode with aborted.
TEST(EpisodeEngineTest, AFailedGroupIsHandedBackOnceAndEveryEpisodeHearsItWasAborted) {
  ServedEnvironment served = ServedEnvironment::Start(With([](ScriptedEnvironment::Script& s) {
    s.step_error = absl::InvalidArgumentError("this environment refuses every turn");
  }));
  EpisodeLoop loop;
  ASSERT_TRUE(loop.episodes().Add(EpisodeGroup("g", RemoteSpec(served.address))).ok());
  ASSERT_TRUE(loop.RunToEnd());
  // Both turns were sent (they run at once) and answered with errors; one failure came back.
  served.env->WaitUntil([](const ScriptedEnvironment& e) { return e.steps_locked() == 2; });
  ASSERT_EQ(loop.failed().size(), 1u);
  EXPECT_TRUE(loop.finished().empty());
  EXPECT_NE(loop.failed()[0].why.message().find("refuses every turn"), std::string::npos)
      << loop.failed()[0].why;
  served.env->WaitUntil([](const ScriptedEnvironment& e) { return e.ended_locked() == 2; });
  std::set<std::string> aborted;
  for (const auto& e : served.env->ended()) {
    EXPECT_TRUE(e.aborted) << e.episode_id;
    EXPECT_TRUE(absl::StartsWith(e.reason, "aborted: ")) << e.reason;
    aborted.insert(e.episode_id);
  }
  EXPECT_EQ(aborted, (std::set<std::string>{"g/0", "g/1"}));
}

// Abort from outside (a reclaimed or lost lease, the actor stopping) tells every episode.
TEST(EpisodeEngineTest, AnAbortedGroupsEpisodesHearOfIt) {
  ServedEnvironment served =
      ServedEnvironment::Start(With([](ScriptedEnvironment::Script& s) { s.hang_steps = true; }));
  EpisodeLoop loop;
  ASSERT_TRUE(loop.episodes().Add(EpisodeGroup("g", RemoteSpec(served.address, 30))).ok());
  ASSERT_TRUE(loop.Run([&] { return served.env->steps().size() == 2; }));
  EXPECT_TRUE(loop.episodes().Abort("g", "reclaimed"));
  EXPECT_FALSE(loop.episodes().Abort("g", "again")) << "a group is given up once";
  served.env->WaitUntil([](const ScriptedEnvironment& e) { return e.ended_locked() == 2; });
  for (const auto& e : served.env->ended()) {
    EXPECT_TRUE(e.aborted);
    EXPECT_EQ(e.reason, "aborted: reclaimed");
  }
  served.env->Release();
  EXPECT_TRUE(loop.episodes().empty());
  EXPECT_TRUE(loop.finished().empty());
  EXPECT_TRUE(loop.failed().empty());
}

// An environment that accepts calls and never answers holds its own call threads only: the
// groups of a healthy environment finish meanwhile.
TEST(EpisodeEngineTest, AHungEnvironmentHoldsOnlyItsOwnCalls) {
  ServedEnvironment hung =
      ServedEnvironment::Start(With([](ScriptedEnvironment::Script& s) { s.hang_steps = true; }));
  ServedEnvironment healthy = ServedEnvironment::Start(
      With([](ScriptedEnvironment::Script& s) { s.done_after_turns = 2; }));
  EpisodeLoop loop({.calls_per_environment = 2});
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(loop.episodes()
                    .Add(EpisodeGroup(absl::StrCat("hung-", i), RemoteSpec(hung.address, 60)))
                    .ok());
  }
  // Both of the hung environment's call threads are blocked before the healthy groups start.
  ASSERT_TRUE(loop.Run([&] { return hung.env->steps().size() >= 2; }));
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(loop.episodes()
                    .Add(EpisodeGroup(absl::StrCat("healthy-", i), RemoteSpec(healthy.address)))
                    .ok());
  }
  ASSERT_TRUE(loop.Run([&] { return loop.finished().size() == 4; }));
  for (const FinishedGroup& g : loop.finished()) {
    EXPECT_TRUE(absl::StartsWith(g.id, "healthy-")) << g.id;
    for (const EpisodeOutcome& o : g.episodes) EXPECT_EQ(o.reward, 1.0);
  }
  EXPECT_EQ(hung.env->steps().size(), 2u) << "the hung environment got only its own threads";
  hung.env->Release();
  ASSERT_TRUE(loop.RunToEnd());
  EXPECT_EQ(loop.finished().size(), 8u);
  EXPECT_TRUE(loop.failed().empty());
}

// The environment goes down after a group's first turn (its second turn's call finds it going
// down, then gone) and comes back on the same port with its state lost: the group waits (no
// failure), then starts again with new episode ids and finishes.
TEST(EpisodeEngineTest, AnEnvironmentOutageIsWaitedOutAndTheEpisodesStartAgain) {
  auto served = std::make_unique<ServedEnvironment>(
      ServedEnvironment::Start(With([](ScriptedEnvironment::Script& s) {
        s.done_after_turns = 3;
        s.unavailable_from_turn = 1;
      })));
  const int port = served->server->port();
  EpisodeLoop loop({.outage_budget = absl::Minutes(10)});
  ASSERT_TRUE(loop.episodes().Add(EpisodeGroup("g", RemoteSpec(served->address, 1), 1)).ok());
  std::thread stopper([&] {
    served->env->WaitUntil([](const ScriptedEnvironment& e) { return e.steps_locked() >= 2; });
    served->server->Shutdown();
  });
  ASSERT_TRUE(loop.Run([&] { return loop.episodes().counts().waiting == 1; }));
  stopper.join();
  EXPECT_TRUE(loop.failed().empty());
  served.reset();
  ServedEnvironment back = ServedEnvironment::Start(
      With([](ScriptedEnvironment::Script& s) { s.done_after_turns = 3; }), port);
  ASSERT_TRUE(loop.RunToEnd());
  ASSERT_TRUE(loop.failed().empty()) << loop.failed()[0].why;
  ASSERT_EQ(loop.finished().size(), 1u);
  EXPECT_EQ(loop.finished()[0].episodes[0].reward, 1.0);
  const std::vector<v1::StartEpisodeRequest> started = back.env->started();
  ASSERT_FALSE(started.empty());
  EXPECT_TRUE(absl::StartsWith(started[0].episode_id(), "g/0~")) << started[0].episode_id();
}

// Nothing listens at the address: the group waits, and fails once the outage outlasts the
// budget.
TEST(EpisodeEngineTest, AnOutageLongerThanTheBudgetFailsTheGroup) {
  const int port = *PickFreePort();
  EpisodeLoop loop({.outage_budget = absl::Milliseconds(200)});
  const std::string address = absl::StrCat("127.0.0.1:", port);
  ASSERT_TRUE(loop.episodes().Add(EpisodeGroup("g", RemoteSpec(address, 0.5), 1)).ok());
  ASSERT_TRUE(loop.RunToEnd());
  ASSERT_EQ(loop.failed().size(), 1u);
  EXPECT_TRUE(absl::IsUnavailable(loop.failed()[0].why)) << loop.failed()[0].why;
  EXPECT_NE(loop.failed()[0].why.message().find("longer than the outage budget"), std::string::npos)
      << loop.failed()[0].why;
}

// One turn and episodes share the engine; a group id is held once.
TEST(EpisodeEngineTest, OneTurnGroupsRunBesideEpisodesAndIdsAreUnique) {
  EpisodeLoop loop;
  GroupRequest one;
  one.id = "one";
  one.prompt = *task::CharTokenizer().Encode("12+34=");
  one.params.n = 3;
  one.params.max_tokens = 5;
  ASSERT_TRUE(loop.episodes().Add(one).ok());
  EXPECT_TRUE(absl::IsAlreadyExists(loop.episodes().Add(one)));
  v1::EnvironmentSpec game;
  game.set_name("guess_number");
  game.set_max_turns(3);
  game.set_max_tokens_per_turn(3);
  for (const auto& [k, v] : std::vector<std::pair<std::string, std::string>>{
           {"higher_text", "+"}, {"lower_text", "-"}, {"rules_text", "#"}}) {
    (*game.mutable_parameters())[k] = v;
  }
  ASSERT_TRUE(loop.episodes().Add(EpisodeGroup("game", game)).ok());
  ASSERT_TRUE(loop.RunToEnd());
  ASSERT_TRUE(loop.failed().empty()) << loop.failed()[0].why;
  ASSERT_EQ(loop.finished().size(), 2u);
  for (const FinishedGroup& g : loop.finished()) {
    EXPECT_EQ(g.episodes.size(), g.id == "one" ? 0u : 2u) << g.id;
    EXPECT_EQ(g.output.samples.size(), g.id == "one" ? 3u : 2u) << g.id;
  }
}

}  // namespace
}  // namespace prl::episode
