// episode/stop_strings.h: a turn ends at the token that completes a stop string anywhere in the
// turn's new text (vLLM's rule), also when that token carries more text, and however many tokens
// the stop string spans.
#include "episode/stop_strings.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "task/char_text_codec.h"
#include "tests/tokenizer/js_reference.h"
#include "tokenizer/hf_text_codec.h"

namespace prl::episode {
namespace {

// The first prefix of `tokens` that StopStrings says completes a stop string (0: none).
size_t FirstStop(const StopStrings& stops, const std::vector<int32_t>& tokens) {
  for (size_t k = 1; k <= tokens.size(); ++k) {
    if (stops.CompletedBy(absl::MakeConstSpan(tokens).first(k))) return k;
  }
  return 0;
}

std::shared_ptr<const tokenizer::TextCodec> Qwen3OrSkip(std::string* skip) {
  *skip = tokenizer::testing::SkipReason();
  if (!skip->empty()) return nullptr;
  auto codec = tokenizer::HfTextCodec::Load(tokenizer::testing::PackageModelDir("qwen3"));
  EXPECT_TRUE(codec.ok()) << codec.status();
  return codec.ok() ? std::shared_ptr<const tokenizer::TextCodec>(std::move(*codec)) : nullptr;
}

// Qwen3's BPE merges ">\n" into one token: the turn "...</call>\n" ends at that token, although
// its text does not end with the stop string.
TEST(StopStringsTest, AStopStringCompletedInsideAMergedTokenEndsTheTurnThere) {
  std::string skip;
  auto codec = Qwen3OrSkip(&skip);
  if (!skip.empty()) GTEST_SKIP() << skip;
  ASSERT_NE(codec, nullptr);
  const std::vector<int32_t> call =
      *codec->EncodeContinuation("Let me compute.<call>734*58</call>\nok");
  const std::vector<int32_t> upto =
      *codec->EncodeContinuation("Let me compute.<call>734*58</call>\n");
  const std::string last = *codec->DecodeCompletion({upto.back()});
  ASSERT_EQ(last, ">\n") << "the tokenizer no longer merges '>' and a newline";
  const StopStrings stops(codec, {"</call>"});
  EXPECT_EQ(FirstStop(stops, call), upto.size());
}

TEST(StopStringsTest, AOneLetterStopStringInsideAWordEndsTheTurnAtThatWord) {
  std::string skip;
  auto codec = Qwen3OrSkip(&skip);
  if (!skip.empty()) GTEST_SKIP() << skip;
  ASSERT_NE(codec, nullptr);
  const std::vector<int32_t> tokens = *codec->EncodeContinuation("use jquery here");
  const std::vector<int32_t> upto = *codec->EncodeContinuation("use jquery");
  ASSERT_EQ(*codec->DecodeCompletion({upto.back()}), " jquery") << "no longer one token";
  EXPECT_EQ(FirstStop(StopStrings(codec, {"q"}), tokens), upto.size());
}

// One token per character: a 40-byte stop string spans 40 tokens, more than the first window.
TEST(StopStringsTest, AStopStringOfManyTokensIsFoundWhereItsLastTokenCompletesIt) {
  auto codec = std::make_shared<task::CharTextCodec>();
  const std::string stop = "((((((((((((((((((((1234567890))))))))))";
  ASSERT_EQ(stop.size(), 40u);
  const std::string text = "12+" + stop + "=7";
  const std::vector<int32_t> tokens = *codec->EncodeContinuation(text);
  const StopStrings stops(codec, {"#", stop});
  EXPECT_EQ(FirstStop(stops, tokens), 3 + stop.size());
  // A partial stop string never ends the turn.
  EXPECT_EQ(FirstStop(stops, *codec->EncodeContinuation("12+" + stop.substr(0, 39))), 0u);
}

TEST(StopStringsTest, NoStopStringsNeverEndATurn) {
  auto codec = std::make_shared<task::CharTextCodec>();
  EXPECT_EQ(FirstStop(StopStrings(codec, {}), *codec->EncodeContinuation("12+34=46")), 0u);
}

}  // namespace
}  // namespace prl::episode
