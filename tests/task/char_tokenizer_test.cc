// The built-in task's character tokenizer: fixed ids, round trips, and errors that name the
// offending character or id and its position.
#include "task/char_tokenizer.h"

#include <gtest/gtest.h>

#include "tests/status_testing.h"

namespace prl::testing {
namespace {

using task::CharTokenizer;

TEST(CharTokenizerTest, IdsAreTheDocumentedTable) {
  const CharTokenizer tok;
  EXPECT_EQ(tok.vocab_size(), 22);
  EXPECT_EQ(tok.pad_id(), 0);
  EXPECT_EQ(tok.bos_id(), 1);
  EXPECT_EQ(tok.eos_id(), 2);
  EXPECT_EQ(
      *tok.Encode("0123456789+-*=() #\n"),
      (std::vector<int32_t>{3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21}));
}

TEST(CharTokenizerTest, EncodeThenDecodeRoundTrips) {
  const CharTokenizer tok;
  for (const char* text : {"", "12+345=357", "(1 - 2) * 3 = -3\n#### -3", "0"}) {
    absl::StatusOr<std::vector<int32_t>> ids = tok.Encode(text);
    ASSERT_TRUE(ids.ok()) << ids.status();
    EXPECT_EQ(ids->size(), std::string(text).size());
    EXPECT_EQ(*tok.Decode(*ids), text);
  }
}

TEST(CharTokenizerTest, DecodeStopsAtEosAndSkipsBosAndPad) {
  const CharTokenizer tok;
  // BOS 1 + 2 EOS 3 PAD
  const std::vector<int32_t> ids = {1, 4, 13, 5, 2, 6, 0};
  EXPECT_EQ(*tok.Decode(ids), "1+2");
  EXPECT_EQ(*tok.Decode({0, 1, 3, 0}), "0");
}

TEST(CharTokenizerTest, UnknownCharacterIsAnErrorNamingItAndItsPosition) {
  const CharTokenizer tok;
  EXPECT_TRUE(IsError(tok.Encode("12+x4").status(), absl::StatusCode::kInvalidArgument,
                      {"'x'", "position 3"}));
  EXPECT_TRUE(IsError(tok.Encode("1\t2").status(), absl::StatusCode::kInvalidArgument,
                      {"'\\x09'", "position 1"}));
  EXPECT_TRUE(IsError(tok.Encode("7/").status(), absl::StatusCode::kInvalidArgument,
                      {"'/'", "position 1"}));
}

TEST(CharTokenizerTest, OutOfVocabularyIdIsAnErrorNamingIdAndPosition) {
  const CharTokenizer tok;
  EXPECT_TRUE(IsError(tok.Decode({3, 4, 22}).status(), absl::StatusCode::kInvalidArgument,
                      {"token id 22", "position 2", "[0, 22)"}));
  EXPECT_TRUE(IsError(tok.Decode({-1}).status(), absl::StatusCode::kInvalidArgument,
                      {"token id -1", "position 0"}));
}

}  // namespace
}  // namespace prl::testing
