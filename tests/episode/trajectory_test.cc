// episode/trajectory.h: which calls continue a trajectory (the same messages and the answers as
// the endpoint gave them, then new ones that are not the assistant's; a text prompt that begins
// with the trajectory) and which start a new one, naming why; answers read as OpenAI reports
// them (stop strings, think blocks, tool calls, finish reasons); streamed content is always a
// prefix of the final content. With Qwen3's real template (npm references; skipped without):
// a chat call's prompt is apply_chat_template(messages, tools) token for token, and a call that
// adds a tool result continues with exactly the template's rendering of it, the history never
// rendered again.
#include "episode/trajectory.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/match.h"
#include "task/char_text_codec.h"
#include "tests/episode/qwen3_reference.h"
#include "tests/tokenizer/js_reference.h"
#include "tokenizer/hf_text_codec.h"

namespace prl::episode {
namespace {

using Json = nlohmann::ordered_json;
using openai::ChatCall;
using openai::ParseChatRequest;

ChatCall Chat(const Json& body) {
  absl::StatusOr<ChatCall> call = ParseChatRequest(body);
  EXPECT_TRUE(call.ok()) << call.status();
  return call.ok() ? *call : ChatCall();
}

const Json kTools = Json::parse(R"([{"type": "function", "function": {"name": "calc",
    "description": "Evaluates arithmetic.", "parameters": {"type": "object",
    "properties": {"expression": {"type": "string"}}, "required": ["expression"]}}}])");

TEST(TrajectoryTest, SameMessageComparesWhatTheAgentSendsBack) {
  const Json ours = {{"role", "assistant"},
                     {"content", ""},
                     {"tool_calls", Json::array({{{"id", "call_1"},
                                                  {"type", "function"},
                                                  {"function",
                                                   {{"name", "calc"},
                                                    {"arguments", {{"expression", "6*7"}}}}}}})}};
  // The SDK sends content null and the arguments as a string: the same after parsing.
  const ChatCall back = Chat({{"messages", Json::array({{{"role", "assistant"},
                                                         {"content", nullptr},
                                                         {"reasoning_content", "hm"},
                                                         {"tool_calls",
                                                          Json::array({{{"id", "call_1"},
                                                                        {"type", "function"},
                                                                        {"function",
                                                                         {{"name", "calc"},
                                                                          {"arguments",
                                                                           "{\"expression\": "
                                                                           "\"6*7\"}"}}}}})}},
                                                        {{"role", "user"}, {"content", "x"}}})}});
  EXPECT_TRUE(SameMessage(back.messages[0], ours));
  Json edited = ours;
  edited["tool_calls"][0]["function"]["arguments"]["expression"] = "6*8";
  EXPECT_FALSE(SameMessage(edited, ours));
  Json renamed = ours;
  renamed["tool_calls"][0]["id"] = "call_2";
  EXPECT_FALSE(SameMessage(renamed, ours));
}

TEST(TrajectoryTest, ATextPromptContinuesWhenItBeginsWithTheTrajectory) {
  task::CharTextCodec codec;
  ChatCall first;
  first.chat = false;
  first.prompt_text = "(1+2)=";
  absl::StatusOr<CallPrompt> a = StartCall(codec, nullptr, first, Json::object());
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_FALSE(a->continues);
  EXPECT_EQ(a->tokens, *codec.EncodePrompt("(1+2)="));
  AnswerText answer;
  answer.content = "3";
  const Trajectory t = Answered(*a, answer, *codec.EncodeContinuation("3"));
  EXPECT_EQ(t.text, "(1+2)=3");
  ChatCall next = first;
  next.prompt_text = "(1+2)=3+4";
  absl::StatusOr<CallPrompt> b = StartCall(codec, &t, next, Json::object());
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_TRUE(b->continues);
  EXPECT_EQ(b->tokens, *codec.EncodeContinuation("+4"));
  next.prompt_text = "(1+2)=4";
  absl::StatusOr<CallPrompt> c = StartCall(codec, &t, next, Json::object());
  ASSERT_TRUE(c.ok());
  EXPECT_FALSE(c->continues);
  EXPECT_EQ(c->split, "the prompt does not begin with the trajectory so far");
  EXPECT_EQ(c->tokens, *codec.EncodePrompt("(1+2)=4"));
}

TEST(TrajectoryTest, AChatCallWithoutATemplateIsRefusedNamingTheMessages) {
  task::CharTextCodec codec;
  absl::StatusOr<CallPrompt> a = StartCall(
      codec, nullptr, Chat({{"messages", Json::array({{{"role", "user"}, {"content", "1"}}})}}),
      Json::object());
  EXPECT_TRUE(absl::IsInvalidArgument(a.status())) << a.status();
  EXPECT_TRUE(absl::StrContains(a.status().message(), "messages: the model's chat template"));
  absl::StatusOr<CallPrompt> prefill = StartCall(
      codec, nullptr,
      Chat({{"messages", Json::array({{{"role", "user"}, {"content", "1"}},
                                      {{"role", "assistant"}, {"content", "2"}}})}}),
      Json::object());
  EXPECT_TRUE(absl::StrContains(prefill.status().message(), "messages[1]: expected the "
                                                            "conversation to end with"))
      << prefill.status();
}

TEST(TrajectoryTest, AnswersReadAsOpenAiReportsThem) {
  ChatCall call = Chat({{"messages", Json::array({{{"role", "user"}, {"content", "q"}}})},
                        {"tools", kTools},
                        {"stop", "STOP"}});
  const AnswerText calls = ReadAnswer(
      "<think>\nadd them\n</think>\n\nLet me compute.\n<tool_call>\n{\"name\": \"calc\", "
      "\"arguments\": {\"expression\": \"6*7\"}}\n</tool_call>",
      call, ToolCallFormat::kHermes, /*by_length=*/false, "e/0");
  EXPECT_EQ(calls.reasoning, "add them");
  EXPECT_EQ(calls.content, "Let me compute.");
  ASSERT_EQ(calls.tool_calls.size(), 1u);
  EXPECT_EQ(calls.tool_calls[0].name(), "calc");
  EXPECT_EQ(Json::parse(calls.tool_calls[0].arguments_json()), Json({{"expression", "6*7"}}));
  EXPECT_EQ(calls.finish_reason, "tool_calls");
  const AnswerText stopped = ReadAnswer("It is 42 STOP and more", call, ToolCallFormat::kHermes,
                                        /*by_length=*/true, "e/1");
  EXPECT_EQ(stopped.content, "It is 42");
  EXPECT_EQ(stopped.finish_reason, "stop") << "a stop string ends it, whatever the budget";
  const AnswerText broken =
      ReadAnswer("<tool_call>{\"name\": oops</tool_call>", call, ToolCallFormat::kHermes, false, "e/2");
  EXPECT_TRUE(broken.tool_calls.empty());
  EXPECT_EQ(broken.content, "<tool_call>{\"name\": oops</tool_call>");
  EXPECT_EQ(broken.finish_reason, "stop");
  EXPECT_EQ(ReadAnswer("It is", call, ToolCallFormat::kHermes, true, "e/3").finish_reason,
            "length");
  call.tool_choice = openai::ToolChoice::kNone;
  EXPECT_TRUE(ReadAnswer("<tool_call>{\"name\": \"calc\"}</tool_call>", call,
                         ToolCallFormat::kHermes, false, "e/4")
                  .tool_calls.empty());
}

TEST(TrajectoryTest, AForcedToolChoiceOpensTheAnswer) {
  ChatCall call = Chat({{"messages", Json::array({{{"role", "user"}, {"content", "q"}}})},
                        {"tools", kTools},
                        {"tool_choice", {{"type", "function"}, {"function", {{"name", "calc"}}}}}});
  EXPECT_EQ(ForcedOpening(ToolCallFormat::kHermes, call),
            "<tool_call>\n{\"name\": \"calc\", \"arguments\": ");
  EXPECT_EQ(ForcedOpening(ToolCallFormat::kLlama3Json, call),
            "{\"name\": \"calc\", \"parameters\": ");
  call.tool_choice = openai::ToolChoice::kRequired;
  EXPECT_EQ(ForcedOpening(ToolCallFormat::kHermes, call), "<tool_call>\n");
  call.tool_choice = openai::ToolChoice::kAuto;
  EXPECT_EQ(ForcedOpening(ToolCallFormat::kHermes, call), "");
  // The opening and what the model wrote after it parse as one call.
  call.tool_choice = openai::ToolChoice::kFunction;
  const AnswerText a = ReadAnswer(ForcedOpening(ToolCallFormat::kHermes, call) +
                                      "{\"expression\": \"1+1\"}}\n</tool_call>",
                                  call, ToolCallFormat::kHermes, false, "e/0");
  ASSERT_EQ(a.tool_calls.size(), 1u);
  EXPECT_EQ(a.finish_reason, "tool_calls");
}

// For every prefix of an answer, what may be streamed is a prefix of the final content.
TEST(TrajectoryTest, StreamedContentIsAlwaysAPrefixOfTheFinalContent) {
  const ChatCall with_tools =
      Chat({{"messages", Json::array({{{"role", "user"}, {"content", "q"}}})},
            {"tools", kTools},
            {"stop", Json::array({"END", "\n\n\n"})}});
  const ChatCall plain = Chat({{"messages", Json::array({{{"role", "user"}, {"content", "q"}}})},
                               {"stop", "END"}});
  const std::vector<std::string> answers = {
      "<think>\nfirst\n</think>\n\nThe answer is 42.",
      "  Sure: <tool_call>\n{\"name\": \"calc\", \"arguments\": {\"expression\": \"2\"}}\n"
      "</tool_call>\n",
      "Plain text that stops at ENDING here",
      "<tool_call>{\"name\": broken</tool_call> then text",
      "A caf\xc3\xa9 answer \xe2\x82\xac ok",
      "<thinking is not a tag> but text",
  };
  for (const ChatCall* call : {&with_tools, &plain}) {
    for (const std::string& answer : answers) {
      const std::string final_content =
          ReadAnswer(answer, *call, ToolCallFormat::kHermes, false, "e/0").content;
      std::string last;
      for (size_t n = 0; n <= answer.size(); ++n) {
        const std::string shown = VisibleContent(answer.substr(0, n), *call, ToolCallFormat::kHermes);
        EXPECT_EQ(final_content.compare(0, shown.size(), shown), 0)
            << "answer '" << answer << "' cut at " << n << " shows '" << shown << "' of '"
            << final_content << "'";
        last = shown;
      }
    }
  }
}

class Qwen3TrajectoryTest : public testing::Qwen3Test {};

// The agent's loop as the OpenAI SDK runs it: the prompt with tools, the model's tool call, the
// tool's result appended; the second call continues with exactly the template's rendering of
// the result after the model's turn.
TEST_F(Qwen3TrajectoryTest, ToolResultsContinueWithTheTemplatesDelta) {
  const Json messages = Json::array({{{"role", "system"}, {"content", "Use the calculator."}},
                                     {{"role", "user"}, {"content", "What is 6*7?"}}});
  const ChatCall first = Chat({{"messages", messages}, {"tools", kTools}});
  absl::StatusOr<CallPrompt> a = StartCall(*codec_, nullptr, first, Json::object());
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->tokens, ReferenceIds({{"messages", messages},
                                  {"tools", kTools},
                                  {"add_generation_prompt", true}}));
  // The model's answer, as its tokens (what the engine would have sampled) and as read.
  const std::string text =
      "<think>\n\n</think>\n\n<tool_call>\n{\"name\": \"calc\", \"arguments\": {\"expression\": "
      "\"6*7\"}}\n</tool_call>";
  std::vector<int32_t> answer_tokens = *codec_->EncodeContinuation(text);
  answer_tokens.push_back(codec_->EncodeContinuation("<|im_end|>")->front());
  const AnswerText answer = ReadAnswer(text, first, ToolCallFormat::kHermes, false, "e/0");
  ASSERT_EQ(answer.tool_calls.size(), 1u);
  const Trajectory t = Answered(*a, answer, answer_tokens);
  // The SDK's next call: the messages, the answer as the endpoint gave it, the tool's result.
  Json next = messages;
  next.push_back({{"role", "assistant"},
                  {"content", nullptr},
                  {"tool_calls", Json::array({{{"id", answer.tool_calls[0].id()},
                                               {"type", "function"},
                                               {"function",
                                                {{"name", "calc"},
                                                 {"arguments",
                                                  answer.tool_calls[0].arguments_json()}}}}})}});
  next.push_back({{"role", "tool"}, {"tool_call_id", answer.tool_calls[0].id()}, {"content", "42"}});
  absl::StatusOr<CallPrompt> b =
      StartCall(*codec_, &t, Chat({{"messages", next}, {"tools", kTools}}), Json::object());
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_TRUE(b->continues) << b->split;
  // The delta is the template's rendering of the tool result after the model's turn: the
  // reference of the whole conversation ends with it, after the turn's end the model sampled.
  // (The rest of the reference differs on purpose: Qwen3's template drops the empty think
  // block of an earlier turn, and the trajectory keeps what the model saw and wrote.)
  Json rendered = next;
  rendered[2]["content"] = "";
  rendered[2]["tool_calls"][0]["function"]["arguments"] =
      Json::parse(answer.tool_calls[0].arguments_json());
  const std::vector<int32_t> reference =
      ReferenceIds({{"messages", rendered}, {"tools", kTools}, {"add_generation_prompt", true}});
  ASSERT_GT(reference.size(), b->tokens.size());
  EXPECT_EQ(std::vector<int32_t>(reference.end() - b->tokens.size(), reference.end()), b->tokens)
      << *codec_->DecodeCompletion(b->tokens);
  EXPECT_EQ(*(reference.end() - b->tokens.size() - 1), answer_tokens.back()) << "<|im_end|>";
  // Editing the system message rewrites the history: a new trajectory, named.
  Json edited = next;
  edited[0]["content"] = "Use the calculator, always.";
  absl::StatusOr<CallPrompt> c =
      StartCall(*codec_, &t, Chat({{"messages", edited}, {"tools", kTools}}), Json::object());
  ASSERT_TRUE(c.ok());
  EXPECT_FALSE(c->continues);
  EXPECT_TRUE(absl::StrContains(c->split, "messages[0] differs")) << c->split;
}

}  // namespace
}  // namespace prl::episode
