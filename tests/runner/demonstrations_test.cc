// runner/demonstrations.h and runner/episode_evaluation.h: the warm-start's episodes against
// the built-in environments are token for token what the actor would record (the model's turns,
// the environment's replies rendered as a delta and marked as context), demonstrate in the
// configured share, and the held-out episodes of a model run to their end.
#include "runner/demonstrations.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "config/run_config.h"
#include "env/calculator.h"
#include "episode/episode_protocol.h"
#include "episode/turn_renderer.h"
#include "model/parameters.h"
#include "runner/episode_evaluation.h"
#include "runner/task_source.h"
#include "task/char_text_codec.h"
#include "task/char_tokenizer.h"
#include "tests/tokenizer/js_reference.h"
#include "tokenizer/hf_text_codec.h"

namespace prl::runner {
namespace {

namespace v1 = prl::v1;
constexpr config::TaskName kArithmetic = config::TaskName::kArithmetic;
constexpr config::TaskName kGame = config::TaskName::kGuessNumber;

v1::Prompt TokenPrompt(const std::string& text, const std::string& reference) {
  const task::CharTokenizer tokenizer;
  v1::Prompt p;
  p.mutable_tokens()->add_ids(tokenizer.bos_id());
  const std::vector<int32_t> ids = *tokenizer.Encode(text);
  for (int32_t id : ids) p.mutable_tokens()->add_ids(id);
  p.set_reference(reference);
  return p;
}

v1::EnvironmentSpec Calculator() {
  v1::EnvironmentSpec e;
  e.set_name("calculator");
  (*e.mutable_parameters())["call_open"] = "(";
  (*e.mutable_parameters())["call_close"] = ")=";
  e.set_max_turns(3);
  e.set_max_tokens_per_turn(12);
  return e;
}

v1::EnvironmentSpec Game() {
  v1::EnvironmentSpec e;
  e.set_name("guess_number");
  for (const auto& [k, v] : std::vector<std::pair<std::string, std::string>>{
           {"low", "1"}, {"high", "50"}, {"higher_text", "+"}, {"lower_text", "-"}}) {
    (*e.mutable_parameters())[k] = v;
  }
  e.set_max_turns(6);
  e.set_max_tokens_per_turn(4);
  return e;
}

std::vector<int32_t> Encode(const std::string& text) { return *task::CharTokenizer().Encode(text); }

TEST(DemonstrationsTest, ACalculatorDemonstrationCallsTheToolThenAnswersItsResultTokenForToken) {
  const task::CharTextCodec codec;
  const v1::Prompt prompt = TokenPrompt("734*58=", "42572");
  auto examples =
      Demonstrations(Calculator(), kArithmetic, codec, {prompt}, 22, /*demo_fraction=*/1.0, 64);
  ASSERT_TRUE(examples.ok()) << examples.status();
  ASSERT_EQ(examples->size(), 1u);
  const SftExample& e = examples->front();
  EXPECT_EQ(e.prompt,
            std::vector<int32_t>(prompt.tokens().ids().begin(), prompt.tokens().ids().end()));
  // The call (ends at the stop string, no stop token), the tool's reply as the character
  // codec renders it (content and a newline), the answer and the stop token.
  std::vector<int32_t> expected = Encode("(734*58)=");
  std::vector<uint8_t> sources(expected.size(), 0);
  for (int32_t id : Encode("42572\n")) {
    expected.push_back(id);
    sources.push_back(1);
  }
  for (int32_t id : Encode("42572")) {
    expected.push_back(id);
    sources.push_back(0);
  }
  expected.push_back(task::CharTokenizer::kEos);
  sources.push_back(0);
  EXPECT_EQ(e.completion, expected);
  EXPECT_EQ(e.sources, sources);
}

// In tool mode (env.params.tool_name) with Qwen3's real tokenizer and template (npm references;
// skipped without them): the demonstration's first turn is the call as Qwen3 writes it (hermes)
// ended by <|im_end|>, the tool's result is the template's delta for a tool message (marked as
// the environment's), then the answer and <|im_end|>.
TEST(DemonstrationsTest, AToolModeDemonstrationIsQwen3sToolCallItsResultAndTheAnswer) {
  if (const std::string reason = tokenizer::testing::SkipReason(); !reason.empty()) {
    GTEST_SKIP() << reason;
  }
  auto codec = tokenizer::HfTextCodec::Load(tokenizer::testing::PackageModelDir("qwen3"));
  ASSERT_TRUE(codec.ok()) << codec.status();
  v1::Prompt prompt;
  v1::ChatMessage* m = prompt.mutable_chat()->add_messages();
  m->set_role("user");
  m->set_content("734*58=");
  prompt.mutable_chat()->set_template_kwargs_json(R"({"enable_thinking": false})");
  prompt.set_reference("42572");
  v1::EnvironmentSpec spec;
  spec.set_name("calculator");
  (*spec.mutable_parameters())["tool_name"] = "calculator";
  spec.set_max_turns(3);
  spec.set_max_tokens_per_turn(40);
  auto examples = Demonstrations(spec, config::TaskName::kPrompts, **codec, {prompt},
                                 (*codec)->vocab_size(), /*demo_fraction=*/1.0, 1024);
  ASSERT_TRUE(examples.ok()) << examples.status();
  ASSERT_EQ(examples->size(), 1u);
  const SftExample& e = examples->front();
  const std::string prompt_text = *(*codec)->DecodeCompletion(e.prompt);
  EXPECT_NE(prompt_text.find("\"name\": \"calculator\""), std::string::npos)
      << "the tool is offered in the prompt: " << prompt_text;
  const int32_t im_end = 151645;
  auto encode = [&](const std::string& text) { return *(*codec)->EncodeContinuation(text); };
  std::vector<int32_t> expected = encode(
      "<tool_call>\n{\"name\": \"calculator\", \"arguments\": {\"expression\": \"734*58\"}}\n"
      "</tool_call>");
  expected.push_back(im_end);
  std::vector<uint8_t> sources(expected.size(), 0);
  for (int32_t id : encode("\n<|im_start|>user\n<tool_response>\n42572\n</tool_response><|im_end|>"
                           "\n<|im_start|>assistant\n<think>\n\n</think>\n\n")) {
    expected.push_back(id);
    sources.push_back(1);
  }
  for (int32_t id : encode("42572")) {
    expected.push_back(id);
    sources.push_back(0);
  }
  expected.push_back(im_end);
  sources.push_back(0);
  EXPECT_EQ(e.completion, expected) << *(*codec)->DecodeCompletion(e.completion);
  EXPECT_EQ(e.sources, sources);
}

// The demonstration's tokens are what the actors' episode engine appends for the same turns: it
// starts an episode with episode::StartRequestOf and episode::FirstPromptOf and renders each
// reply with episode::RenderReply after the turn's last token; played here against a fresh
// built-in calculator, the reply after the call is exactly the demonstration's environment
// tokens, and the answer ends the episode with reward 1.
TEST(DemonstrationsTest, TheEnvironmentsTokensAreWhatTheEpisodeEngineAppends) {
  auto codec = std::make_shared<task::CharTextCodec>();
  const v1::Prompt prompt = TokenPrompt("734*58=", "42572");
  auto examples = Demonstrations(Calculator(), kArithmetic, *codec, {prompt}, 22, 1.0, 64);
  ASSERT_TRUE(examples.ok()) << examples.status();
  const SftExample& demo = examples->front();
  // The model's call, the environment's reply, the model's answer.
  std::vector<int32_t> call, reply, answer;
  for (size_t t = 0; t < demo.completion.size(); ++t) {
    (demo.sources[t] == 1 ? reply : reply.empty() ? call : answer).push_back(demo.completion[t]);
  }
  ASSERT_FALSE(call.empty());
  ASSERT_FALSE(reply.empty());
  ASSERT_FALSE(answer.empty());

  episode::GroupRequest group;
  group.id = "demo";
  group.prompt.assign(prompt.tokens().ids().begin(), prompt.tokens().ids().end());
  group.environment = Calculator();
  group.reference = prompt.reference();
  env::CalculatorEnvironment calculator;
  auto started = calculator.StartEpisode(episode::StartRequestOf(group, 0, "demo/0", *codec));
  ASSERT_TRUE(started.ok()) << started.status();
  auto first =
      episode::FirstPromptOf(*codec, group.prompt, group.submitted, started->observation(), {});
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(*first, demo.prompt);
  v1::StepRequest step;
  step.set_episode_id("demo/0");
  step.set_text(*codec->DecodeCompletion(call));
  step.set_turn_end(v1::TURN_END_STOP_STRING);
  auto tool = calculator.Step(step);
  ASSERT_TRUE(tool.ok()) << tool.status();
  ASSERT_FALSE(tool->done());
  auto rendered = episode::RenderReply(*codec, tool->messages(), call.back());
  ASSERT_TRUE(rendered.ok()) << rendered.status();
  EXPECT_EQ(*rendered, reply);
  step.set_turn_index(1);
  step.set_text(*codec->DecodeCompletion(answer));
  step.set_turn_end(v1::TURN_END_END_OF_TURN);
  auto done = calculator.Step(step);
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_TRUE(done->done());
  EXPECT_EQ(done->episode_reward(), 1.0);
}

TEST(DemonstrationsTest, TheConfiguredShareDemonstratesAndTheRestAnswerAtOnce) {
  const task::CharTextCodec codec;
  std::vector<v1::Prompt> prompts;
  for (int i = 0; i < 1000; ++i) {
    const int a = 10 + i % 90, b = 3 + i % 7;
    prompts.push_back(TokenPrompt(absl::StrCat(a, "*", b, "="), absl::StrCat(a * b)));
  }
  auto examples = Demonstrations(Calculator(), kArithmetic, codec, prompts, 22, 0.3, 64);
  ASSERT_TRUE(examples.ok()) << examples.status();
  int calls = 0;
  for (size_t i = 0; i < examples->size(); ++i) {
    const SftExample& e = (*examples)[i];
    const bool call = std::find(e.sources.begin(), e.sources.end(), 1) != e.sources.end();
    calls += call ? 1 : 0;
    if (!call) {  // the reference and the stop token
      std::vector<int32_t> direct = Encode(prompts[i].reference());
      direct.push_back(task::CharTokenizer::kEos);
      EXPECT_EQ(e.completion, direct) << i;
    }
    // Any prefix demonstrates about the share (a low-discrepancy sequence).
    if (i + 1 == 100) {
      EXPECT_NEAR(calls / 100.0, 0.3, 0.02);
    }
  }
  EXPECT_NEAR(calls / 1000.0, 0.3, 0.005);
}

// The guesses a game demonstration makes (the model's turns), in order.
std::vector<std::string> Guesses(const SftExample& e) {
  std::vector<std::string> out(1);
  for (size_t t = 0; t < e.completion.size(); ++t) {
    if (e.sources[t] == 1) continue;
    if (e.completion[t] == task::CharTokenizer::kEos) {
      out.emplace_back();
      continue;
    }
    out.back() += *task::CharTokenizer().Decode({&e.completion[t], 1});
  }
  out.pop_back();
  return out;
}

TEST(DemonstrationsTest, AGameDemonstrationBisectsAndTheOthersGuessTheFirstQuarter) {
  const task::CharTextCodec codec;
  const v1::Prompt prompt = TokenPrompt("#", "37");
  auto bisect = Demonstrations(Game(), kGame, codec, {prompt}, 22, 1.0, 64);
  ASSERT_TRUE(bisect.ok()) << bisect.status();
  EXPECT_EQ(Guesses(bisect->front()),
            (std::vector<std::string>{"25", "38", "31", "34", "36", "37"}));
  // Replies: "+\n" after a low guess, "-\n" after a high one, as context.
  const std::vector<int32_t> higher = Encode("+\n");
  EXPECT_EQ(std::vector<int32_t>(bisect->front().completion.begin() + 3,
                                 bisect->front().completion.begin() + 5),
            higher);
  auto quarter = Demonstrations(Game(), kGame, codec, {prompt}, 22, 0.0, 64);
  ASSERT_TRUE(quarter.ok()) << quarter.status();
  // 1 + 49/4 = 13, then [14, 50] -> 23, [24, 50] -> 30, [31, 50] -> 35, [36, 50] -> 39,
  // [36, 38] -> 36: six guesses, lost (kept: the imperfect play RL starts from).
  EXPECT_EQ(Guesses(quarter->front()),
            (std::vector<std::string>{"13", "23", "30", "35", "39", "36"}));
}

TEST(DemonstrationsTest, ADemonstrationThatCannotWinIsAnErrorNamingThePrompt) {
  const task::CharTextCodec codec;
  auto examples = Demonstrations(Calculator(), kArithmetic, codec, {TokenPrompt("12*3=", "37")}, 22,
                                 /*demo_fraction=*/1.0, 64);
  ASSERT_FALSE(examples.ok());
  EXPECT_NE(examples.status().message().find("warm-start prompt 0 ('12*3='"), std::string::npos)
      << examples.status();
  EXPECT_NE(examples.status().message().find("did not win"), std::string::npos);
  v1::EnvironmentSpec remote = Calculator();
  remote.set_address("127.0.0.1:7000");
  EXPECT_FALSE(HasDemonstrations(remote, kArithmetic));
  EXPECT_FALSE(Demonstrations(remote, kArithmetic, codec, {}, 22, 1.0, 64).ok());
  // The calculator's demonstrations read arithmetic questions: the built-in task's, or a prompt
  // file's (prl task export); never another task's.
  EXPECT_TRUE(HasDemonstrations(Calculator(), config::TaskName::kPrompts));
  EXPECT_FALSE(HasDemonstrations(Calculator(), config::TaskName::kGuessNumber));
  EXPECT_FALSE(HasDemonstrations(Game(), kArithmetic));
}

TEST(DemonstrationsTest, ADemonstrationOverTheLimitsOfRlsEpisodesIsAnErrorNamingTheSetting) {
  const task::CharTextCodec codec;
  v1::EnvironmentSpec short_turns = Calculator();
  short_turns.set_max_tokens_per_turn(6);  // "(734*58)=" is 9
  auto turn = Demonstrations(short_turns, kArithmetic, codec, {TokenPrompt("734*58=", "42572")}, 22,
                             1.0, 64);
  ASSERT_FALSE(turn.ok());
  EXPECT_NE(turn.status().message().find("env.max_tokens_per_turn (or task.max_tokens): 6"),
            std::string::npos)
      << turn.status();
  v1::EnvironmentSpec short_episodes = Calculator();
  short_episodes.set_max_episode_tokens(12);
  auto episode = Demonstrations(short_episodes, kArithmetic, codec,
                                {TokenPrompt("734*58=", "42572")}, 22, 1.0, 64);
  ASSERT_FALSE(episode.ok());
  EXPECT_NE(episode.status().message().find("env.max_episode_tokens (12)"), std::string::npos);
  auto context =
      Demonstrations(Calculator(), kArithmetic, codec, {TokenPrompt("734*58=", "42572")}, 22, 1.0,
                     /*max_sequence_tokens=*/16);
  ASSERT_FALSE(context.ok());
  EXPECT_NE(context.status().message().find("model.max_position_embeddings"), std::string::npos);
}

TEST(TaskSourceTest, TheBuiltInEnvironmentsWordsMustBeWritableInTheTasksText) {
  const task::CharTextCodec codec;
  config::RunConfig c;
  c.env.name = "calculator";  // "<calc>" by default: no letters in the character tokenizer
  absl::Status s = CheckEnvironmentText(c, codec);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("env.params.call_open: '<calc>' (the default) cannot be written"),
            std::string::npos)
      << s;
  c.env.params = {{"call_open", "("}, {"call_close", ")="}};
  EXPECT_TRUE(CheckEnvironmentText(c, codec).ok());
  c.env.name = "guess_number";
  c.env.params = {{"higher_text", "+"}, {"lower_text", "-"}};
  s = CheckEnvironmentText(c, codec);
  EXPECT_NE(s.message().find("env.params.rules_text: 'guess a number from 1 to 100' (the "
                             "default)"),
            std::string::npos)
      << s;
  c.env.address = "127.0.0.1:7000";  // a user's environment: its words are its own business
  EXPECT_TRUE(CheckEnvironmentText(c, codec).ok());
}

TEST(EpisodeEvaluationTest, HeldOutGamesOfAnUntrainedModelRunToTheirEndOverEverySecret) {
  config::RunConfig c;
  c.task.name = config::TaskName::kGuessNumber;
  c.task.max_tokens = 4;
  c.env.name = "guess_number";
  c.env.params = {
      {"low", "1"}, {"high", "20"}, {"higher_text", "+"}, {"lower_text", "-"}, {"rules_text", "#"}};
  c.env.max_turns = 5;
  auto task = OpenTask(c, "", 22);
  ASSERT_TRUE(task.ok()) << task.status();
  ModelConfig m;
  m.arch = Architecture::kQwen2;
  m.hidden_size = 32;
  m.intermediate_size = 64;
  m.num_hidden_layers = 1;
  m.num_attention_heads = 4;
  m.num_key_value_heads = 2;
  m.head_dim = 8;
  m.vocab_size = 22;
  m.max_position_embeddings = 64;
  m.tie_word_embeddings = true;
  m.qkv_bias = true;
  auto weights = ParameterSet::Allocate(m, Device::Cpu(), false);
  ASSERT_TRUE(weights.ok());
  InitializeParameters(*weights, 3, 0.5f);
  auto result = EvaluateEpisodes(std::make_shared<const ParameterSet>(std::move(*weights)), **task,
                                 100, EnvironmentOf(c));
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->problems, 20);  // every secret of [1, 20] once
  EXPECT_GE(result->turns_mean, 1.0);
  EXPECT_LE(result->turns_mean, 5.0);
  EXPECT_GE(result->accuracy, 0.0);
  EXPECT_LE(result->accuracy, 1.0);
}

}  // namespace
}  // namespace prl::runner
