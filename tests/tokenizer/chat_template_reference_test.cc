// prl's chat templates against @huggingface/jinja, byte for byte: the Qwen3 template (with
// tools, with and without thinking) and the Llama 3 and Llama 3.1 templates shipped by the npm
// packages (no package ships a Qwen2.5 template), and small templates that exercise every
// construct of the supported subset. Errors for unsupported constructs name them and the line.
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/status_testing.h"
#include "tests/tokenizer/js_reference.h"
#include "tokenizer/chat_template/chat_template.h"

namespace prl::tokenizer {
namespace {

using json = nlohmann::ordered_json;

std::string PackageTemplate(const std::string& family) {
  std::ifstream in(testing::PackageModelDir(family) + "/tokenizer_config.json");
  std::stringstream text;
  text << in.rdbuf();
  return json::parse(text.str())["chat_template"].get<std::string>();
}

json Tools() {
  return json::parse(R"([
    {"type": "function", "function": {"name": "get_weather",
      "description": "Current weather in a city — °C, \"quoted\", 東京",
      "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "City name"},
        "days": {"type": "integer", "enum": [1, 2, 3]}}, "required": ["city"]}}},
    {"type": "function", "function": {"name": "search", "description": "Web search",
      "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}}])");
}

// Conversations: system prompts, several turns, tool calls and responses, reasoning.
std::vector<json> Conversations() {
  return {
      json::parse(R"([{"role": "user", "content": "Hi!"}])"),
      json::parse(R"([{"role": "system", "content": "You are terse."},
                      {"role": "user", "content": "  What is 2+2?  \n"},
                      {"role": "assistant", "content": "4"},
                      {"role": "user", "content": "And 3+3? 日本語 😀"}])"),
      json::parse(R"([{"role": "system", "content": "Use tools."},
        {"role": "user", "content": "Weather in Paris and Tokyo?"},
        {"role": "assistant", "content": "", "tool_calls": [
          {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}},
          {"type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Tokyo\"}"}}]},
        {"role": "tool", "content": "{\"temp\": 21}"},
        {"role": "tool", "content": "{\"temp\": 25}"},
        {"role": "assistant", "content": "<think>\nBoth are warm.\n</think>\n\nParis 21, Tokyo 25."},
        {"role": "user", "content": "<tool_response>x</tool_response>"}])"),
      json::parse(R"([{"role": "user", "content": "Think first."},
        {"role": "assistant", "content": "Answer one.", "reasoning_content": "Reasoning one."},
        {"role": "user", "content": "Again."},
        {"role": "assistant", "content": "<think>\nR2\n</think>\nAnswer two."}])"),
      json::parse(R"([{"role": "user", "content": "Call it."},
        {"role": "assistant", "content": "Calling.", "tool_calls": [
          {"name": "search", "arguments": {"q": "a \"b\" ü"}}]},
        {"role": "tool", "content": "result"}])"),
  };
}

struct Case {
  std::string name, source;
  json context;
};

void ExpectRendersLikeReference(const std::vector<Case>& cases) {
  json input = json::array();
  for (const Case& c : cases) input.push_back({{"template", c.source}, {"context", c.context}});
  auto reference = testing::RunReference("render", {}, input);
  ASSERT_TRUE(reference.ok()) << reference.status();
  ASSERT_EQ(reference->size(), cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    const json& expected = (*reference)[i];
    ASSERT_TRUE(expected.contains("text")) << cases[i].name << ": reference failed: " << expected;
    auto tmpl = ChatTemplate::Parse(cases[i].source);
    ASSERT_TRUE(tmpl.ok()) << cases[i].name << ": " << tmpl.status();
    ChatTemplateInputs inputs;
    for (const auto& [key, value] : cases[i].context.items()) {
      if (key == "messages") {
        inputs.messages = value;
      } else if (key == "tools") {
        inputs.tools = value;
      } else if (key == "add_generation_prompt") {
        inputs.add_generation_prompt = value.get<bool>();
      } else if (key == "bos_token") {
        inputs.bos_token = value.get<std::string>();
      } else if (key == "eos_token") {
        inputs.eos_token = value.get<std::string>();
      } else {
        inputs.extra[key] = value;
      }
    }
    auto text = tmpl->Render(inputs);
    ASSERT_TRUE(text.ok()) << cases[i].name << ": " << text.status();
    EXPECT_EQ(*text, expected["text"].get<std::string>()) << cases[i].name;
  }
}

class ChatTemplateReferenceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (const std::string reason = testing::SkipReason(); !reason.empty()) GTEST_SKIP() << reason;
  }
};

TEST_F(ChatTemplateReferenceTest, ModelTemplatesRenderLikeHuggingFaceJinja) {
  std::vector<Case> cases;
  for (const char* family : {"qwen3", "llama3", "llama3_1"}) {
    const std::string source = PackageTemplate(family);
    const std::vector<json> conversations = Conversations();
    for (size_t c = 0; c < conversations.size(); ++c) {
      for (int variant = 0; variant < 4; ++variant) {
        json context = {{"messages", conversations[c]},
                        {"add_generation_prompt", variant % 2 == 1},
                        {"bos_token", "<|begin_of_text|>"},
                        {"eos_token", "<|eot_id|>"}};
        if (variant >= 2) context["tools"] = Tools();
        if (variant == 3) context["enable_thinking"] = false;
        cases.push_back(
            {absl::StrCat(family, " conversation ", c, " variant ", variant), source, context});
      }
    }
  }
  ExpectRendersLikeReference(cases);
}

TEST_F(ChatTemplateReferenceTest, EveryConstructRendersLikeHuggingFaceJinja) {
  const json context = {{"messages", Conversations()[2]},
                        {"tools", Tools()},
                        {"add_generation_prompt", true},
                        {"bos_token", "<s>"},
                        {"names", {"b", "a", "c"}},
                        {"n", 7},
                        {"x", 2.5},
                        {"text", "  Hello, World  "}};
  const std::vector<std::pair<std::string, std::string>> templates = {
      {"loop",
       "{% for m in messages %}{{ loop.index }}/{{ loop.index0 }}/{{ loop.length }}/"
       "{{ loop.revindex }}/{{ 'F' if loop.first }}{{ 'L' if loop.last }}:{{ m.role }}"
       "{% if not loop.last %}, {% endif %}{% endfor %}"},
      {"previtem_nextitem",
       "{% for v in names %}[{{ loop.previtem }}<{{ v }}>{{ loop.nextitem }}]"
       "{% endfor %}"},
      {"for_else_filter",
       "{% for v in names if v != 'a' %}{{ v }}{% else %}none{% endfor %}"
       "{% for v in [] %}x{% else %}empty{% endfor %}"},
      {"break_continue",
       "{% for i in range(10) %}{% if i == 2 %}{% continue %}{% endif %}"
       "{% if i > 5 %}{% break %}{% endif %}{{ i }}{% endfor %}"},
      {"if_elif_else",
       "{% for i in range(4) %}{% if i == 0 %}zero{% elif i == 1 %}one"
       "{% elif i is even %}even{% else %}odd{% endif %};{% endfor %}"},
      {"set_scoping",
       "{% set a = 1 %}{% for i in range(3) %}{% set a = i %}{% endfor %}{{ a }}"
       "{% set ns = namespace(a=1, b='x') %}{% for i in range(3) %}"
       "{% set ns.a = ns.a + i %}{% endfor %}{{ ns.a }}{{ ns.b }}"},
      {"block_set", "{% set block %}<{{ n }}>\n{% endset %}[{{ block }}]"},
      {"macro",
       "{% macro greet(who, punct='!') %}Hi {{ who }}{{ punct }}{% endmacro %}"
       "{{ greet('A') }} {{ greet('B', '?') }} {{ greet(who='C', punct='.') }}"},
      {"arithmetic",
       "{{ n + 1 }} {{ n - 10 }} {{ n * 3 }} {{ n // 2 }} {{ n % 3 }} {{ -n // 2 }}"
       " {{ 2 ** 10 }} {{ (n + 1) * 2 }} {{ 'T' if n > 3 and n < 10 }}"
       " {{ 'T' if n == 7.0 }} {{ x * 2 }} {{ n / 2 }}"},
      {"strings",
       "{{ text.strip() }}|{{ text.lstrip() }}|{{ text.rstrip() }}|"
       "{{ text.strip().split(', ') }}|{{ text.upper() }}|{{ text.lower() }}|"
       "{{ text.replace('l', 'L') }}|{{ 'T' if text.strip().startswith('Hello') }}|"
       "{{ 'T' if text.strip().endswith(('x', 'World')) }}|{{ 'a,b,,c'.split(',') }}|"
       "{{ ' a  b '.split() }}|{{ 'x' ~ n ~ 'y' }}|{{ 'abc' + 'def' }}|"
       "{{ 'T' if 'ab' in 'cabd' }}|{{ 'T' if 'z' not in 'abc' }}"},
      {"subscripts_slices",
       "{{ names[0] }}{{ names[-1] }}{{ names[1:] }}{{ names[::-1] }}"
       "{{ names[:2] }}{{ 'hello'[1:3] }}{{ 'hello'[::-1] }}{{ 'hello'[-1] }}"
       "{{ messages[0]['role'] }}{{ messages[0].content }}"},
      {"filters",
       "{{ names | length }} {{ text | trim }} {{ names | join('-') }} "
       "{{ names | first }} {{ names | last }} {{ 'abc' | upper }} {{ 'ABC' | lower }}"
       " {{ 'hello world' | capitalize }} {{ '42' | int + 1 }} {{ names | reverse | "
       "join }} {{ missing | default('dflt') }} {{ n | string }}{{ x | string }}"
       " {{ tools | map(attribute='type') | join(',') }}"},
      {"tojson",
       "{{ tools | tojson }}\n{{ tools[0] | tojson(indent=2) }}\n{{ names | tojson }}"
       "{{ 'ü \"q\" \\n' | tojson }}{{ {'k': [1, 'v', none, true]} | tojson }}"},
      {"tests",
       "{% for t in [missing is defined, n is defined, none is none, text is string,"
       " tools is mapping, tools[0] is mapping, names is iterable, n is number,"
       " n is odd, n is even, x is not none,"
       " tools[0].function.missing is defined] %}{{ 'T' if t else 'F' }}{% endfor %}"},
      {"dicts",
       "{% for k, v in tools[0].function.parameters.properties.items() %}{{ k }}="
       "{{ v.type }};{% endfor %}{{ tools[0].get('type') }}{{ tools[0].get('nope', 'd') }}"
       "{{ tools[0].function.parameters.required | length }}"},
      {"ternary_and_or",
       "{{ 'yes' if n > 3 else 'no' }}{{ 'yes' if n > 30 else 'no' }}"
       "{{ none or 'fallback' }}{{ names and 'set' }}{{ '' or 'e' }}"},
      {"whitespace_control",
       "a  \n  {%- if true -%}  \n  b  \n  {%- endif -%}  \n  c\n"
       "  {% if true %}\n    d\n  {% endif %}\n{{- ' e ' -}}  \n f {# note #}\n"
       "  {#- stripped -#}  g\n"},
      {"generation_prompt",
       "{{ bos_token }}{% for m in messages %}<{{ m.role }}>{% endfor %}"
       "{% if add_generation_prompt %}<assistant>{% endif %}"},
  };
  std::vector<Case> cases;
  for (const auto& [name, source] : templates) cases.push_back({name, source, context});
  ExpectRendersLikeReference(cases);
}

TEST(ChatTemplateErrorTest, UnsupportedConstructsNameTheConstructAndLine) {
  EXPECT_TRUE(prl::testing::IsError(
      ChatTemplate::Parse("a\nb\n{% include 'other.jinja' %}").status(),
      absl::StatusCode::kInvalidArgument, {"line 3", "unsupported statement {% include %}"}));
  EXPECT_TRUE(prl::testing::IsError(ChatTemplate::Parse("\n{{ text | wordcount }}").status(),
                                    absl::StatusCode::kInvalidArgument,
                                    {"line 2", "unsupported filter 'wordcount'"}));
  EXPECT_TRUE(prl::testing::IsError(ChatTemplate::Parse("{% if x is prime %}{% endif %}").status(),
                                    absl::StatusCode::kInvalidArgument,
                                    {"line 1", "unsupported test 'prime'"}));
  EXPECT_TRUE(prl::testing::IsError(ChatTemplate::Parse("{% for x in y %}").status(),
                                    absl::StatusCode::kInvalidArgument, {"endfor"}));
  auto tmpl = ChatTemplate::Parse("ok\n\n{{ 'x'.zfill(3) }}");
  ASSERT_TRUE(tmpl.ok()) << tmpl.status();
  EXPECT_TRUE(prl::testing::IsError(tmpl->Render({}).status(), absl::StatusCode::kUnimplemented,
                                    {"line 3", "unsupported method 'zfill' of a string"}));
  auto raising = ChatTemplate::Parse(
      "{% if messages | length == 0 %}\n"
      "{{ raise_exception('No messages') }}{% endif %}");
  ASSERT_TRUE(raising.ok());
  EXPECT_TRUE(prl::testing::IsError(raising->Render({}).status(),
                                    absl::StatusCode::kInvalidArgument,
                                    {"line 2", "raise_exception: No messages"}));
}

}  // namespace
}  // namespace prl::tokenizer
