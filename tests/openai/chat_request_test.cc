// openai/chat_request.h: OpenAI's request fields read and normalised, and every malformed field
// refused naming it, with the expected and the found value.
#include "openai/chat_request.h"

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"

namespace prl::openai {
namespace {

using Json = nlohmann::ordered_json;

TEST(ChatRequestTest, AFullRequestIsReadAndNormalised) {
  const Json body = Json::parse(R"({
    "model": "anything",
    "messages": [
      {"role": "developer", "content": "Be brief."},
      {"role": "user", "content": [{"type": "text", "text": "What is "}, {"type": "text", "text": "6*7?"}]},
      {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
        "function": {"name": "calc", "arguments": "{\"x\": \"6*7\"}"}}]},
      {"role": "tool", "tool_call_id": "call_1", "content": "42"}],
    "tools": [{"type": "function", "function": {"name": "calc", "parameters": {"type": "object"}}}],
    "tool_choice": {"type": "function", "function": {"name": "calc"}},
    "temperature": 0.7, "top_p": 0.9, "max_completion_tokens": 64, "stop": "END", "seed": 7,
    "logprobs": true, "top_logprobs": 3, "stream": true, "stream_options": {"include_usage": true},
    "n": 1, "user": "u"})");
  const absl::StatusOr<ChatCall> call = ParseChatRequest(body);
  ASSERT_TRUE(call.ok()) << call.status();
  EXPECT_EQ(call->messages[0]["role"], "system") << "developer is the system prompt";
  EXPECT_EQ(call->messages[1]["content"], "What is 6*7?");
  EXPECT_EQ(call->messages[2]["content"], "");
  EXPECT_EQ(call->messages[2]["tool_calls"][0]["function"]["arguments"], Json({{"x", "6*7"}}))
      << "arguments parsed, as a chat template renders them";
  EXPECT_EQ(call->messages[3]["tool_call_id"], "call_1");
  EXPECT_EQ(call->tool_choice, ToolChoice::kFunction);
  EXPECT_EQ(call->tool_choice_function, "calc");
  EXPECT_FLOAT_EQ(call->temperature.value_or(-1), 0.7f);
  EXPECT_FLOAT_EQ(call->top_p.value_or(-1), 0.9f);
  EXPECT_EQ(call->max_tokens, 64);
  EXPECT_EQ(call->stop, std::vector<std::string>{"END"});
  EXPECT_EQ(call->seed, 7u);
  EXPECT_TRUE(call->logprobs);
  EXPECT_EQ(call->top_logprobs, 3);
  EXPECT_TRUE(call->stream);
  EXPECT_TRUE(call->include_usage);
}

TEST(ChatRequestTest, EveryMalformedFieldIsNamedWithWhatWasExpectedAndFound) {
  const Json base = Json::parse(R"({"messages": [{"role": "user", "content": "hi"}]})");
  ASSERT_TRUE(ParseChatRequest(base).ok());
  struct Case {
    std::string patch, error;
  };
  const std::vector<Case> cases = {
      {R"({"messages": []})", "messages: expected a non-empty array, found []"},
      {R"({"messages": [{"role": "robot", "content": "x"}]})",
       "messages[0].role: expected system, developer, user, assistant or tool, found \"robot\""},
      {R"({"messages": [{"role": "user", "content": 3}]})",
       "messages[0].content: expected a string or an array of text parts, found 3"},
      {R"({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]})",
       "messages[0].content[0]: expected a text part"},
      {R"({"messages": [{"role": "assistant", "content": "", "tool_calls": [{"type": "function",
          "function": {"name": "f", "arguments": 3}}]}]})",
       "messages[0].tool_calls[0].function.arguments: expected a string, found 3"},
      {R"({"messages": [{"role": "assistant", "content": "", "tool_calls": [{"type": "function",
          "function": {"name": "f", "arguments": "[1]"}}]}]})",
       "messages[0].tool_calls[0].function.arguments: expected a JSON object as a string"},
      {R"({"messages": [{"role": "tool", "content": "42"}]})",
       "messages[0].tool_call_id: expected a string, found null"},
      {R"({"messages": [{"role": "user", "content": "x", "audio": 1}]})",
       "messages[0].audio: not a field this endpoint serves"},
      {R"({"tools": [{"type": "code_interpreter"}]})",
       "tools[0]: expected {\"type\": \"function\""},
      {R"({"tool_choice": "always"})", "tool_choice: expected auto, none, required or a function"},
      {R"({"tool_choice": "required"})", "tool_choice: expected auto or none without tools"},
      {R"({"tools": [{"type": "function", "function": {"name": "f"}}],
          "tool_choice": {"type": "function", "function": {"name": "g"}}})",
       "tool_choice.function.name: expected the name of one of the request's tools, found \"g\""},
      {R"({"temperature": 3})", "temperature: expected a number in [0, 2], found 3"},
      {R"({"top_p": 0})", "top_p: expected a number in (0, 1], found 0"},
      {R"({"max_tokens": 0})", "max_tokens: expected an integer from 1 to 1048576, found 0"},
      {R"({"n": 2})", "n: expected 1"},
      {R"({"stop": ["a", "b", "c", "d", "e"]})", "stop: expected a string or up to 4 strings"},
      {R"({"stop": [""]})", "stop[0]: expected 1 to 64 bytes"},
      {R"({"top_logprobs": 2})", "top_logprobs: expected logprobs: true with it, found 2"},
      {R"({"top_logprobs": 21, "logprobs": true})",
       "top_logprobs: expected an integer from 0 to 20, found 21"},
      {R"({"frequency_penalty": 0.5})", "frequency_penalty: expected 0"},
      {R"({"response_format": {"type": "json_object"}})",
       "response_format: not a field this endpoint serves"},
  };
  for (const Case& c : cases) {
    Json body = base;
    body.update(Json::parse(c.patch));
    const absl::Status s = ParseChatRequest(body).status();
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << c.patch << ": " << s;
    EXPECT_NE(s.message().find(c.error), std::string::npos) << c.patch << ": " << s;
  }
  ChatLimits small;
  small.max_messages = 1;
  Json two = base;
  two["messages"].push_back(two["messages"][0]);
  EXPECT_NE(ParseChatRequest(two, small).status().message().find("messages: expected at most 1"),
            std::string::npos);
}

TEST(ChatRequestTest, ACompletionTakesTextOrTokenIds) {
  absl::StatusOr<ChatCall> text = ParseCompletionRequest(
      Json::parse(R"({"prompt": "12+34=", "max_tokens": 4, "logprobs": 2})"));
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_FALSE(text->chat);
  EXPECT_EQ(text->prompt_text, "12+34=");
  EXPECT_EQ(text->top_logprobs, 2);
  absl::StatusOr<ChatCall> ids = ParseCompletionRequest(Json::parse(R"({"prompt": [1, 2, 3]})"));
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_EQ(ids->prompt_ids, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_NE(ParseCompletionRequest(Json::parse(R"({"prompt": ["a", "b"]})"))
                .status()
                .message()
                .find("prompt: expected a string or an array of token ids"),
            std::string::npos);
  EXPECT_NE(ParseCompletionRequest(Json::parse(R"({"prompt": "x", "echo": true})"))
                .status()
                .message()
                .find("echo: expected false"),
            std::string::npos);
}

// Each of these took the actor down (nlohmann's value() threw type_error, or a recursive copy of
// a deep body overflowed the stack); each is now a 400 naming the field and the found type.
TEST(ChatRequestTest, WrongTypedMembersAndDeepBodiesAreRefusedNamingTheFieldNeverThrown) {
  struct Case {
    std::string body, error;
  };
  const std::string deep_messages = R"({"messages": [{"role": "user", "content": "hi", "name": )" +
                                    std::string(100'000, '[') + std::string(100'000, ']') + "}]}";
  const std::vector<Case> cases = {
      {R"({"messages": [{"role": "user", "content": [{"type": null, "text": "x"}]}]})",
       "messages[0].content[0]: expected a text part"},
      {R"({"messages": [{"role": "user", "content": [{"type": 1, "text": "x"}]}]})",
       "messages[0].content[0]: expected a text part"},
      {R"({"messages": [{"role": "assistant", "content": "", "tool_calls": [{"id": 7,
          "type": "function", "function": {"name": "f", "arguments": "{}"}}]}]})",
       "messages[0].tool_calls[0].id: expected a string, found 7"},
      {R"({"messages": [{"role": "user", "content": "hi"}], "stream": true,
          "stream_options": {"include_usage": null}})",
       ""},  // null: the default, as for every optional member
      {R"({"messages": [{"role": "user", "content": "hi"}],
          "stream_options": {"include_usage": "yes"}})",
       "stream_options.include_usage: expected true or false, found a string"},
      {R"({"messages": [{"role": "user", "content": "hi"}],
          "tools": [{"type": 1, "function": {"name": "f"}}]})",
       "tools[0]: expected {\"type\": \"function\""},
      {R"({"messages": [{"role": "user", "content": "hi"}],
          "tool_choice": {"type": null, "function": {"name": "f"}}})",
       "tool_choice: expected"},
      {R"({"messages": [{"role": "assistant", "content": "", "tool_calls": [{"type": "function",
          "function": {"name": "f", "arguments": ")" +
           std::string(1000, '[') + R"("}}]}]})",
       "messages[0].tool_calls[0].function.arguments: expected JSON nested at most 64 deep"},
      {deep_messages, "the request body: expected JSON nested at most 64 deep, found deeper"},
  };
  for (const Case& c : cases) {
    const absl::StatusOr<ChatCall> call = ParseChatRequestBody(c.body);
    if (c.error.empty()) {
      EXPECT_TRUE(call.ok()) << c.body.substr(0, 200) << ": " << call.status();
      continue;
    }
    EXPECT_TRUE(absl::IsInvalidArgument(call.status()))
        << c.body.substr(0, 200) << ": " << call.status();
    EXPECT_NE(call.status().message().find(c.error), std::string::npos)
        << c.body.substr(0, 200) << ": " << call.status();
  }
  EXPECT_TRUE(absl::IsInvalidArgument(ParseChatRequestBody("not json").status()));
  EXPECT_TRUE(absl::IsInvalidArgument(
      ParseCompletionRequestBody(std::string(100'000, '[') + std::string(100'000, ']')).status()));
}

// A token id is checked before it is narrowed: 4294967297 is not token 1.
TEST(ChatRequestTest, ATokenIdBeyondInt32IsRefusedNotNarrowed) {
  for (const char* id : {"4294967297", "2147483648", "-1", "18446744073709551615"}) {
    const absl::Status s =
        ParseCompletionRequestBody(absl::StrCat(R"({"prompt": [1, )", id, "]}")).status();
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << id << ": " << s;
    EXPECT_NE(s.message().find("prompt[1]: expected a token id from 0 to 2147483647"),
              std::string::npos)
        << s;
  }
  const absl::StatusOr<ChatCall> top = ParseCompletionRequestBody(R"({"prompt": [2147483647]})");
  ASSERT_TRUE(top.ok()) << top.status();
  EXPECT_EQ(top->prompt_ids, std::vector<int32_t>{2147483647});
}

}  // namespace
}  // namespace prl::openai
