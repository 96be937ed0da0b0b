// core/json_input.h: JSON from outside a role is parsed within its depth and size bounds (the
// depth refused before any value is built, without recursion), and members are read with their
// types checked: a wrong type is an error naming the field, never a throw.
#include "core/json_input.h"

#include <gtest/gtest.h>

#include <string>

#include "tests/status_testing.h"

namespace prl {
namespace {

using Json = nlohmann::ordered_json;

std::string Nested(int depth) { return std::string(depth, '[') + std::string(depth, ']'); }

TEST(JsonInputTest, NestingPastTheLimitIsRefusedNamingTheFieldWithoutExhaustingTheStack) {
  // 100,000 levels (200 KB) overflowed the coordinator's stack through a recursive copy.
  const absl::StatusOr<Json> deep = ParseJsonInput(Nested(100'000), "prompts[0].chat.tools_json");
  ASSERT_FALSE(deep.ok());
  EXPECT_EQ(deep.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(deep.status().message(),
            "prompts[0].chat.tools_json: expected JSON nested at most 64 deep, found deeper");
  const std::string objects = [] {
    std::string s;
    for (int i = 0; i < 100'000; ++i) s += "{\"a\":";
    s += "1";
    s += std::string(100'000, '}');
    return s;
  }();
  EXPECT_FALSE(ParseJsonInput(objects, "body").ok());

  const absl::StatusOr<Json> at_limit = ParseJsonInput(Nested(kMaxJsonDepth), "f");
  ASSERT_TRUE(at_limit.ok()) << at_limit.status();
  EXPECT_EQ(JsonDepth(*at_limit), kMaxJsonDepth);
  EXPECT_FALSE(ParseJsonInput(Nested(kMaxJsonDepth + 1), "f").ok());
  JsonLimits shallow;
  shallow.max_depth = 2;
  EXPECT_TRUE(ParseJsonInput(R"({"a": [1]})", "f", shallow).ok());
  EXPECT_FALSE(ParseJsonInput(R"({"a": [[1]]})", "f", shallow).ok());
  // Brackets inside strings are text, not nesting.
  EXPECT_TRUE(ParseJsonInput("\"" + std::string(1000, '[') + "\"", "f", shallow).ok());
}

TEST(JsonInputTest, SizeAndSyntaxErrorsNameTheFieldAndWhatWasFound) {
  JsonLimits small;
  small.max_bytes = 8;
  EXPECT_TRUE(testing::IsError(ParseJsonInput("[1,2,3,4,5]", "body", small).status(),
                               absl::StatusCode::kInvalidArgument,
                               {"body: expected JSON of at most 8 bytes, found 11 bytes"}));
  EXPECT_TRUE(testing::IsError(ParseJsonInput("{\"a\": }", "line 3").status(),
                               absl::StatusCode::kInvalidArgument,
                               {"line 3: expected JSON, found a syntax error at byte"}));
  EXPECT_TRUE(testing::IsError(ParseJsonInput("", "line 3").status(),
                               absl::StatusCode::kInvalidArgument,
                               {"line 3: expected JSON, found nothing"}));
  EXPECT_TRUE(testing::IsError(ParseJsonInput("[1] [2]", "x").status(),
                               absl::StatusCode::kInvalidArgument, {"x: expected JSON"}));
  const absl::StatusOr<nlohmann::json> unordered = ParseJsonInputUnordered(R"({"b":1,"a":2})", "x");
  ASSERT_TRUE(unordered.ok());
  EXPECT_EQ((*unordered)["a"], 2);
}

TEST(JsonInputTest, JsonDepthWalksAValueDeeperThanAnyStackWithoutRecursion) {
  Json deep = Json::array();
  Json* at = &deep;
  for (int i = 0; i < 200'000; ++i) at = &at->emplace_back(Json::array());
  EXPECT_EQ(JsonDepth(deep), 200'001);
  EXPECT_EQ(JsonExcerpt(deep), "(too deep to show)");
  EXPECT_EQ(JsonDepth(Json(3)), 0);
  EXPECT_EQ(JsonDepth(Json::parse(R"({"a": [1, {"b": []}]})")), 4);
}

TEST(JsonInputTest, AMemberOfAnotherTypeIsAnErrorNamingItNeverAThrow) {
  const Json object = Json::parse(
      R"({"type": null, "id": 7, "flag": "yes", "n": 4294967297, "f": 1.5, "neg": -3, "s": "x"})");
  // Absent or null: the fallback.
  EXPECT_EQ(*MemberString(object, "type", "messages[0].content[0]", "text"), "text");
  EXPECT_EQ(*MemberString(object, "missing", "m", "d"), "d");
  EXPECT_EQ(*MemberString(object, "s", "m"), "x");
  EXPECT_TRUE(testing::IsError(MemberString(object, "id", "tool_calls[0]").status(),
                               absl::StatusCode::kInvalidArgument,
                               {"tool_calls[0].id: expected a string, found a number (7)"}));
  EXPECT_TRUE(testing::IsError(MemberBool(object, "flag", "stream_options", false).status(),
                               absl::StatusCode::kInvalidArgument,
                               {"stream_options.flag: expected true or false, found a string"}));
  EXPECT_FALSE(*MemberBool(object, "type", "stream_options", false));
  EXPECT_TRUE(testing::IsError(MemberInt(object, "n", "", 0, INT32_MAX, 0).status(),
                               absl::StatusCode::kInvalidArgument,
                               {"n: expected an integer from 0 to 2147483647, found a number "
                                "(4294967297)"}));
  EXPECT_FALSE(MemberInt(object, "f", "", 0, 10, 0).ok()) << "a float is no count";
  EXPECT_FALSE(MemberInt(object, "neg", "", 0, 10, 0).ok());
  EXPECT_EQ(*MemberInt(object, "neg", "", -5, 10, 0), -3);
  EXPECT_EQ(*MemberInt(object, "missing", "", 0, 10, 9), 9);
  // A non-object reads as if every member were absent.
  EXPECT_EQ(*MemberString(Json::array(), "x", "f", "d"), "d");
}

}  // namespace
}  // namespace prl
