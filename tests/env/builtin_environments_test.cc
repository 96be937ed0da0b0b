// prl's built-in environments (env/calculator.h, env/guess_number.h) and the per-episode
// idempotency they share (env/episode_table.h).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "env/calculator.h"
#include "env/guess_number.h"
#include "tests/env/env_testing.h"
#include "tests/status_testing.h"

namespace prl::env {
namespace {

using ::prl::testing::IsError;

TEST(CalculatorTest, ExpressionsAreExactIntegersAndErrorsSayWhy) {
  EXPECT_EQ(*EvaluateExpression("734*58"), 42572);
  EXPECT_EQ(*EvaluateExpression(" 2 + 3*(4 - 1) "), 11);
  EXPECT_EQ(*EvaluateExpression("-(7*-6)/3"), 14);
  EXPECT_EQ(*EvaluateExpression("999999999*999999999"), 999999998000000001);
  EXPECT_TRUE(IsError(EvaluateExpression("1/0").status(), absl::StatusCode::kInvalidArgument,
                      {"division by zero"}));
  EXPECT_TRUE(IsError(EvaluateExpression("7/2").status(), absl::StatusCode::kInvalidArgument,
                      {"7/2 is not an integer"}));
  EXPECT_TRUE(IsError(EvaluateExpression("9999999999*9999999999").status(),
                      absl::StatusCode::kInvalidArgument, {"overflow"}));
  EXPECT_TRUE(
      IsError(EvaluateExpression("2+").status(), absl::StatusCode::kInvalidArgument, {"missing"}));
  EXPECT_TRUE(IsError(EvaluateExpression("2+x").status(), absl::StatusCode::kInvalidArgument,
                      {"unexpected 'x'"}));
  EXPECT_TRUE(
      IsError(EvaluateExpression(std::string(40, '(') + "1" + std::string(40, ')')).status(),
              absl::StatusCode::kInvalidArgument, {"too deeply nested"}));
  int64_t v = 0;
  ASSERT_TRUE(LastInteger("so it is -42, I think 17.", &v));
  EXPECT_EQ(v, 17);
  EXPECT_FALSE(LastInteger("no digits", &v));
}

using testing::Turn;

v1::StartEpisodeRequest Start(const std::string& id, const std::string& reference) {
  return testing::Start("", id, reference);
}

// A call is answered by the tool, a retried turn gets the same answer, a turn out of order is
// refused naming the turn expected, and the answer turn ends the episode with its reward.
TEST(CalculatorTest, AToolCallIsAnsweredAndTheFinalAnswerIsScored) {
  CalculatorEnvironment calc;
  absl::StatusOr<v1::StartEpisodeResponse> started = calc.StartEpisode(Start("e1", "42572"));
  ASSERT_TRUE(started.ok()) << started.status();
  ASSERT_EQ(started->stop_strings_size(), 1);
  EXPECT_EQ(started->stop_strings(0), "</calc>");
  const v1::StepRequest call =
      Turn("e1", 0, "Let me compute <calc>734*58</calc>", v1::TURN_END_STOP_STRING);
  absl::StatusOr<v1::StepResponse> result = calc.Step(call);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_FALSE(result->done());
  ASSERT_EQ(result->messages_size(), 1);
  EXPECT_EQ(result->messages(0).role(), "tool");
  EXPECT_EQ(result->messages(0).content(), "42572");
  EXPECT_EQ(calc.Step(call)->SerializeAsString(), result->SerializeAsString()) << "a retry";
  EXPECT_TRUE(IsError(calc.Step(Turn("e1", 3, "x")).status(), absl::StatusCode::kFailedPrecondition,
                      {"out of order (expected 1)"}));
  absl::StatusOr<v1::StepResponse> answer = calc.Step(Turn("e1", 1, "The answer is 42572"));
  ASSERT_TRUE(answer.ok()) << answer.status();
  EXPECT_TRUE(answer->done());
  EXPECT_EQ(answer->episode_reward(), 1.0);
  EXPECT_EQ(answer->done_reason(), "right answer after 1 calculator calls");
  EXPECT_EQ(calc.Step(Turn("e1", 1, "The answer is 42572"))->episode_reward(), 1.0)
      << "the final turn retried after the episode finished";

  ASSERT_TRUE(calc.StartEpisode(Start("e2", "42572")).ok());
  const v1::StepResponse bad =
      *calc.Step(Turn("e2", 0, "<calc>1/0</calc>", v1::TURN_END_STOP_STRING));
  EXPECT_EQ(bad.messages(0).content(), "error: division by zero") << "a tool error is a message";
  EXPECT_EQ(calc.Step(Turn("e2", 1, "42000"))->episode_reward(), 0.0);

  ASSERT_TRUE(calc.StartEpisode(Start("e3", "5")).ok());
  EXPECT_EQ(calc.EndEpisode([] {
                  v1::EndEpisodeRequest r;
                  r.set_episode_id("e3");
                  r.set_truncated(true);
                  return r;
                }())
                ->episode_reward(),
            0.0);
  EXPECT_TRUE(IsError(calc.StartEpisode(Start("e4", "forty")).status(),
                      absl::StatusCode::kInvalidArgument, {"reference: expected the answer"}));
}

// With tool_name the calculator is an OpenAI function tool: offered in tools_json (no stop
// strings), each structured call answered by a tool message with its id, bad arguments or an
// unknown tool answered as errors the model sees, and a turn without calls scored as the answer.
TEST(CalculatorTest, InToolModeStructuredCallsAreAnsweredByIdAndTheAnswerScored) {
  CalculatorEnvironment calc;
  v1::StartEpisodeRequest start = Start("t", "391");
  (*start.mutable_parameters())["tool_name"] = "calculator";
  const absl::StatusOr<v1::StartEpisodeResponse> started = calc.StartEpisode(start);
  ASSERT_TRUE(started.ok()) << started.status();
  EXPECT_EQ(started->stop_strings_size(), 0);
  EXPECT_EQ(started->tools_json(), CalculatorTools("calculator"));
  EXPECT_EQ(CalculatorTools("calc"),
            R"([{"type":"function","function":{"name":"calc","description":"Evaluates an )"
            R"(arithmetic expression of integers with + - * / and parentheses.","parameters":)"
            R"({"type":"object","properties":{"expression":{"type":"string"}},"required":)"
            R"(["expression"]}}}])");
  v1::StepRequest turn = Turn("t", 0, "<tool_call>...</tool_call>");
  auto call = [&](const std::string& id, const std::string& name, const std::string& args) {
    v1::ToolCall* c = turn.add_tool_calls();
    c->set_id(id);
    c->set_name(name);
    c->set_arguments_json(args);
  };
  call("call_1", "calculator", R"({"expression": "17*23"})");
  call("call_2", "calculator", R"({"expr": "1"})");
  call("call_3", "search", R"({"q": "x"})");
  call("call_4", "calculator", R"({"expression": "1/0"})");
  const absl::StatusOr<v1::StepResponse> answered = calc.Step(turn);
  ASSERT_TRUE(answered.ok()) << answered.status();
  EXPECT_FALSE(answered->done());
  ASSERT_EQ(answered->messages_size(), 4);
  const std::vector<std::pair<std::string, std::string>> want = {
      {"call_1", "391"},
      {"call_2", "error: expected {\"expression\": \"...\"}"},
      {"call_3", "error: unknown tool search"},
      {"call_4", "error: division by zero"}};
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(answered->messages(i).role(), "tool");
    EXPECT_EQ(answered->messages(i).tool_call_id(), want[i].first);
    EXPECT_EQ(answered->messages(i).content(), want[i].second);
  }
  const absl::StatusOr<v1::StepResponse> answer = calc.Step(Turn("t", 1, "It is 391."));
  ASSERT_TRUE(answer.ok()) << answer.status();
  EXPECT_TRUE(answer->done());
  EXPECT_EQ(answer->episode_reward(), 1.0);
  // The call syntax is not a call in tool mode: the turn is the (wrong) answer.
  start.set_episode_id("u");
  ASSERT_TRUE(calc.StartEpisode(start).ok());
  const absl::StatusOr<v1::StepResponse> text_call =
      calc.Step(Turn("u", 0, "<calc>17*23</calc>", v1::TURN_END_STOP_STRING));
  ASSERT_TRUE(text_call.ok()) << text_call.status();
  EXPECT_TRUE(text_call->done());
  EXPECT_EQ(text_call->episode_reward(), 0.0);
}

// The character tokenizer has no letters: the call syntax is a parameter.
TEST(CalculatorTest, TheCallSyntaxIsAParameter) {
  CalculatorEnvironment calc;
  v1::StartEpisodeRequest start = Start("c", "391");
  (*start.mutable_parameters())["call_open"] = "#";
  (*start.mutable_parameters())["call_close"] = "=";
  EXPECT_EQ(calc.StartEpisode(start)->stop_strings(0), "=");
  EXPECT_EQ(calc.Step(Turn("c", 0, "#17*23=", v1::TURN_END_STOP_STRING))->messages(0).content(),
            "391");
}

// The trace lists each operation as it is evaluated, a long multiplication's partial products
// (nonzero digits, lowest first) before its product.
TEST(CalculatorTest, TheTraceListsEachOperationAndItsPartialProducts) {
  std::vector<std::string> trace;
  EXPECT_EQ(*EvaluateExpression("2 + 3*(4 - 1)", &trace), 11);
  EXPECT_EQ(trace, (std::vector<std::string>{"4-1=3", "3*3=9", "2+9=11"}));
  trace.clear();
  EXPECT_EQ(*EvaluateExpression("730*508", &trace), 370840);
  EXPECT_EQ(trace, (std::vector<std::string>{"730*8=5840", "730*500=365000", "730*508=370840"}));
  trace.clear();
  EXPECT_EQ(*EvaluateExpression("-12*34", &trace), -408);
  EXPECT_EQ(trace, (std::vector<std::string>{"-12*4=-48", "-12*30=-360", "-12*34=-408"}));
  trace.clear();
  EXPECT_EQ(*EvaluateExpression("999999999*999999999", &trace), 999999998000000001);
  EXPECT_EQ(trace.size(), 10u);
  EXPECT_EQ(trace.back(), "999999999*999999999=999999998000000001");
}

// output_chars: a call is answered by exactly that many characters of trace, padding and the
// result last (the reply's last integer), in the character tokenizer's alphabet; a retry gets
// the same reply; structured calls too; an error or a result longer than asked stays as it is.
TEST(CalculatorTest, LongToolOutputsEndWithTheResult) {
  CalculatorEnvironment calc;
  v1::StartEpisodeRequest start = Start("o", "42572");
  (*start.mutable_parameters())["call_open"] = "(";
  (*start.mutable_parameters())["call_close"] = ")=";
  (*start.mutable_parameters())["output_chars"] = "200";
  ASSERT_TRUE(calc.StartEpisode(start).ok());
  const v1::StepRequest call = Turn("o", 0, "(734*58)=", v1::TURN_END_STOP_STRING);
  const absl::StatusOr<v1::StepResponse> answered = calc.Step(call);
  ASSERT_TRUE(answered.ok()) << answered.status();
  const std::string& reply = answered->messages(0).content();
  const std::string block = "734*8=5872\n734*50=36700\n734*58=42572\n";  // 37 characters
  EXPECT_EQ(reply, block + block + block + block + block + std::string(10, ' ') + "42572");
  EXPECT_EQ(reply.size(), 200u);
  EXPECT_EQ(reply.find_first_not_of("0123456789+-*=() #\n"), std::string::npos);
  int64_t last = 0;
  ASSERT_TRUE(LastInteger(reply, &last));
  EXPECT_EQ(last, 42572);
  EXPECT_EQ(calc.Step(call)->messages(0).content(), reply) << "a retry";
  EXPECT_EQ(calc.Step(Turn("o", 1, "42572"))->episode_reward(), 1.0);

  EXPECT_EQ(ToolReply("734*58", 0), "42572") << "0: the result alone";
  EXPECT_EQ(ToolReply("734*58", 3), "42572") << "shorter than the result";
  EXPECT_EQ(ToolReply("734*58", 40), std::string(35, ' ') + "42572") << "no whole trace fits";
  EXPECT_EQ(ToolReply("7", 4), "   7") << "no operation, no trace";
  EXPECT_EQ(ToolReply("1/0", 200), "error: division by zero");

  (*start.mutable_parameters())["tool_name"] = "calculator";
  start.set_episode_id("t");
  ASSERT_TRUE(calc.StartEpisode(start).ok());
  v1::StepRequest turn = Turn("t", 0, "<tool_call>...</tool_call>");
  v1::ToolCall* c = turn.add_tool_calls();
  c->set_id("call_1");
  c->set_name("calculator");
  c->set_arguments_json(R"({"expression": "734*58"})");
  EXPECT_EQ(calc.Step(turn)->messages(0).content(), reply);
}

// output_chars is an integer from 0 to kMaxOutputChars; anything else is refused at the
// episode's start, naming the parameter, the range and what was found.
TEST(CalculatorTest, OutputCharsIsValidated) {
  CalculatorEnvironment calc;
  auto start = [&](const std::string& value) {
    v1::StartEpisodeRequest r = Start("v" + value, "1");
    (*r.mutable_parameters())["output_chars"] = value;
    return calc.StartEpisode(r).status();
  };
  EXPECT_TRUE(IsError(start("-1"), absl::StatusCode::kInvalidArgument,
                      {"calculator: parameter output_chars: expected 0 to 65536", "found -1"}));
  EXPECT_TRUE(IsError(start("65537"), absl::StatusCode::kInvalidArgument,
                      {"parameter output_chars: expected 0 to 65536", "found 65537"}));
  EXPECT_TRUE(IsError(start("many"), absl::StatusCode::kInvalidArgument,
                      {"parameter output_chars: expected an integer", "found 'many'"}));
  EXPECT_TRUE(start("65536").ok());
}

// Later turns depend on earlier ones: higher / lower until solved, or out of guesses.
TEST(GuessNumberTest, FeedbackLeadsToTheSecretAndGuessesRunOut) {
  GuessNumberEnvironment game;
  ASSERT_TRUE(game.StartEpisode(Start("g", "37")).ok());
  EXPECT_EQ(game.Step(Turn("g", 0, "50"))->messages(0).content(), "lower");
  EXPECT_EQ(game.Step(Turn("g", 1, "25"))->messages(0).content(), "higher");
  EXPECT_EQ(game.Step(Turn("g", 2, "hmm"))->messages(0).content(), "guess a number from 1 to 100");
  const v1::StepResponse solved = *game.Step(Turn("g", 3, "37"));
  EXPECT_TRUE(solved.done());
  EXPECT_EQ(solved.episode_reward(), 1.0);
  EXPECT_EQ(solved.done_reason(), "solved in 4 guesses");

  v1::StartEpisodeRequest start = Start("h", "99");
  (*start.mutable_parameters())["max_guesses"] = "2";
  ASSERT_TRUE(game.StartEpisode(start).ok());
  EXPECT_FALSE(game.Step(Turn("h", 0, "50"))->done());
  const v1::StepResponse out = *game.Step(Turn("h", 1, "75"));
  EXPECT_TRUE(out.done());
  EXPECT_EQ(out.episode_reward(), 0.0);
  EXPECT_EQ(out.done_reason(), "out of guesses (2)");
  EXPECT_TRUE(IsError(game.StartEpisode(Start("i", "101")).status(),
                      absl::StatusCode::kInvalidArgument, {"an integer in [1, 100]", "'101'"}));
}

TEST(EpisodeTableTest, LiveEpisodesAreBoundedOldestFirst) {
  EpisodeTable<int> table(2);  // the environments' tables hold 100,000
  table.Start("a", [] { return 1; });
  table.Start("b", [] { return 2; });
  table.Start("c", [] { return 3; });
  EXPECT_EQ(table.live(), 2u);
  EXPECT_TRUE(
      IsError(table.Step(Turn("a", 0, ""), [](int&) { return v1::StepResponse(); }).status(),
              absl::StatusCode::kNotFound, {"episode 'a' is unknown"}));
  EXPECT_TRUE(table.Step(Turn("c", 0, ""), [](int&) { return v1::StepResponse(); }).ok());
}

// Finished episodes (kept for retries) make room before any live one is dropped.
TEST(EpisodeTableTest, FinishedEpisodesAreForgottenBeforeLiveOnes) {
  EpisodeTable<int> table(3);
  const auto end = [](int&) { return v1::EndEpisodeResponse(); };
  v1::EndEpisodeRequest over;
  for (const char* id : {"a", "b", "c"}) table.Start(id, [] { return 0; });
  over.set_episode_id("a");
  ASSERT_TRUE(table.End(over, end).ok());
  over.set_episode_id("b");
  ASSERT_TRUE(table.End(over, end).ok());  // a and b finished, c live
  table.Start("d", [] { return 0; });
  table.Start("e", [] { return 0; });  // over the bound twice: a, then b, go
  EXPECT_EQ(table.live(), 3u);
  EXPECT_EQ(table.finished(), 0u);
  for (const char* id : {"c", "d", "e"}) {
    EXPECT_TRUE(table.Step(Turn(id, 0, ""), [](int&) { return v1::StepResponse(); }).ok()) << id;
  }
}

}  // namespace
}  // namespace prl::env
