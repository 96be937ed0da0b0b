// episode/episode_protocol.h: what StartEpisode carries of the prompt (the question, the
// messages), how a turn ended (a stop string on the turn's last allowed token is a stop string),
// and the next turn's budget within max_episode_tokens and the context.
#include "episode/episode_protocol.h"

#include <gtest/gtest.h>

#include "tests/episode/episode_testing.h"

namespace prl::episode {
namespace {

v1::EnvironmentSpec Spec() {
  v1::EnvironmentSpec spec;
  spec.set_name("scripted");
  spec.set_max_turns(8);
  spec.set_max_tokens_per_turn(16);
  return spec;
}

TEST(EpisodeProtocolTest, AChatPromptsEpisodeStartsWithItsQuestionAndItsMessages) {
  const task::CharTextCodec codec;
  GroupRequest g;
  g.environment = Spec();
  g.prompt = {1, 2, 3};
  g.reference = "42";
  v1::Chat* chat = g.submitted.mutable_chat();
  for (const auto& [role, content] :
       std::vector<std::pair<std::string, std::string>>{{"system", "Be brief."},
                                                        {"user", "First?"},
                                                        {"assistant", "Yes."},
                                                        {"user", "What is 6*7?"}}) {
    v1::ChatMessage* m = chat->add_messages();
    m->set_role(role);
    m->set_content(content);
  }
  const v1::StartEpisodeRequest r = StartRequestOf(g, 1, "lease/1", codec);
  EXPECT_EQ(r.prompt_text(), "What is 6*7?") << "the user's last message";
  ASSERT_EQ(r.prompt_messages_size(), 4);
  EXPECT_EQ(r.prompt_messages(0).role(), "system");
  EXPECT_EQ(r.prompt_messages(3).content(), "What is 6*7?");
  EXPECT_EQ(r.episode_id(), "lease/1");
  EXPECT_EQ(r.sample_index(), 1);
  EXPECT_EQ(r.reference(), "42");
  EXPECT_EQ(r.environment(), "scripted");
}

TEST(EpisodeProtocolTest, ATextPromptsEpisodeStartsWithItsTextAndATokenPromptWithItsDecode) {
  const task::CharTextCodec codec;
  GroupRequest g;
  g.environment = Spec();
  g.prompt = *task::CharTokenizer().Encode("12+34=");
  g.submitted.set_text("12 + 34 =");
  EXPECT_EQ(StartRequestOf(g, 0, "a/0", codec).prompt_text(), "12 + 34 =");
  EXPECT_EQ(StartRequestOf(g, 0, "a/0", codec).prompt_messages_size(), 0);
  g.submitted.Clear();
  EXPECT_EQ(StartRequestOf(g, 0, "a/0", codec).prompt_text(), "12+34=");
}

TEST(EpisodeProtocolTest, TheNextTurnFitsTheEpisodeBudgetAndTheContext) {
  v1::EnvironmentSpec spec = Spec();
  EXPECT_EQ(NextTurnBudget(10, 0, 100, spec).max_tokens, 16);
  EXPECT_EQ(NextTurnBudget(90, 40, 100, spec).max_tokens, 10);
  EXPECT_EQ(NextTurnBudget(100, 40, 100, spec).truncate, "context 100");
  spec.set_max_episode_tokens(50);
  EXPECT_EQ(NextTurnBudget(20, 40, 100, spec).max_tokens, 10);
  EXPECT_EQ(NextTurnBudget(20, 50, 100, spec).truncate, "max_episode_tokens 50");
}

// The engine ends a turn at a stop string (its end_turn) also on the turn's last allowed token:
// the turn reports STOP_STRING, not MAX_TOKENS.
TEST(EpisodeProtocolTest, AStopStringOnTheTurnsLastAllowedTokenIsAStopString) {
  auto engine = *Engine::Create(testing::TinyCharWeights(), 0, EngineOptions{});
  SamplingParams p;
  p.max_tokens = 3;
  p.multi_turn = true;
  p.seed = 1;
  p.end_turn = [](absl::Span<const int32_t> turn) { return turn.size() == 3; };
  const uint64_t id = *engine->AddRequest(*task::CharTokenizer().Encode("1+1="), p);
  std::vector<TurnOutput> turns;
  while (turns.empty()) {
    ASSERT_TRUE(engine->Step().ok());
    turns = engine->TakeTurns();
  }
  ASSERT_EQ(turns.size(), 1u);
  ASSERT_EQ(turns[0].tokens.size(), 3u);
  EXPECT_EQ(turns[0].reason, FinishReason::kStop);
  EXPECT_EQ(TurnEndOf(turns[0], p.stop_token_ids), v1::TURN_END_STOP_STRING);
  ASSERT_TRUE(engine->FinishSample(id, 0).ok());
}

}  // namespace
}  // namespace prl::episode
