// The tokenizer on small hand-made tokenizer.json documents: errors that name the JSON path of
// an unsupported component, added-token flags that the shipped files do not use (single_word,
// normalized), merge order, stop ids, invalid input, and concurrent Encode / Decode.
#include "tokenizer/tokenizer.h"

#include <thread>

#include "gtest/gtest.h"
#include "tests/status_testing.h"
#include "tests/tokenizer/corpus.h"
#include "tests/tokenizer/js_reference.h"
#include "tokenizer/chat_template/chat_template.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/unicode.h"

namespace prl::tokenizer {
namespace {

using json = nlohmann::json;

// A byte-level BPE over GPT-2's byte alphabet (ids 0..255) with merges a+b, ab+c, b+c.
json TinyTokenizer() {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) {
    std::string token;
    AppendUtf8(ByteToUnicode(static_cast<unsigned char>(b)), &token);
    vocab[token] = b;
  }
  vocab["ab"] = 256;
  vocab["abc"] = 257;
  vocab["bc"] = 258;
  return {{"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", {"a b", "ab c", "b c"}}}},
          {"normalizer", {{"type", "Replace"}, {"pattern", {{"String", "x"}}}, {"content", "y"}}},
          {"pre_tokenizer",
           {{"type", "Sequence"},
            {"pretokenizers",
             {{{"type", "Split"},
               {"pattern", {{"Regex", "\\s+|\\S+"}}},
               {"behavior", "Isolated"},
               {"invert", false}},
              {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}}},
          {"decoder", {{"type", "ByteLevel"}}},
          {"added_tokens",
           {{{"id", 300}, {"content", "<|x|>"}, {"special", true}},
            {{"id", 301}, {"content", "tok"}, {"special", false}, {"single_word", true}},
            {{"id", 302}, {"content", "yy"}, {"special", false}, {"normalized", true}}}}};
}

std::unique_ptr<Tokenizer> Make(const json& tokenizer_json, const json& config = nullptr,
                                const json& generation = nullptr) {
  auto t = Tokenizer::FromJson(tokenizer_json, config, generation);
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? std::move(*t) : nullptr;
}

std::vector<int32_t> Ids(const Tokenizer& t, const std::string& text) {
  auto ids = t.Encode(text, false);
  EXPECT_TRUE(ids.ok()) << ids.status();
  return ids.ok() ? *ids : std::vector<int32_t>{};
}

TEST(TokenizerTest, MergesApplyLowestRankFirst) {
  auto t = Make(TinyTokenizer());
  // a+b (rank 0) before b+c (rank 2), then ab+c (rank 1); a space is byte 32, id 32.
  EXPECT_EQ(Ids(*t, "abc"), (std::vector<int32_t>{257}));
  EXPECT_EQ(Ids(*t, "bc"), (std::vector<int32_t>{258}));
  EXPECT_EQ(Ids(*t, "abcbc ab"), (std::vector<int32_t>{257, 258, 32, 256}));
}

TEST(TokenizerTest, SingleWordTokenMatchesOnlyOutsideWords) {
  auto t = Make(TinyTokenizer());
  const std::vector<int32_t> alone = Ids(*t, "a tok b");
  EXPECT_NE(std::find(alone.begin(), alone.end(), 301), alone.end());
  const std::vector<int32_t> inside = Ids(*t, "atok tokb");
  EXPECT_EQ(std::find(inside.begin(), inside.end(), 301), inside.end());
}

TEST(TokenizerTest, NormalizedTokenMatchesTheNormalizedText) {
  auto t = Make(TinyTokenizer());
  EXPECT_EQ(Ids(*t, "xx"), (std::vector<int32_t>{302}));     // x -> y, then "yy"
  EXPECT_EQ(Ids(*t, "<|x|>"), (std::vector<int32_t>{300}));  // matched before normalisation
  auto text = t->Decode(std::vector<int32_t>{300, 256, 302}, /*skip_special_tokens=*/true);
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(*text, "abyy");
}

TEST(TokenizerTest, UnsupportedComponentsNameTheirJsonPath) {
  json t = TinyTokenizer();
  t["pre_tokenizer"]["pretokenizers"][1] = {{"type", "Digits"}, {"individual_digits", true}};
  EXPECT_EQ(Tokenizer::FromJson(t, nullptr, nullptr).status().message(),
            "tokenizer.json: pre_tokenizer.pretokenizers[1].type: unsupported \"Digits\" "
            "(supported: Split, ByteLevel, Sequence, Metaspace)");
  t = TinyTokenizer();
  t["model"]["type"] = "Unigram";
  EXPECT_EQ(Tokenizer::FromJson(t, nullptr, nullptr).status().message(),
            "tokenizer.json: model.type: unsupported \"Unigram\" (supported: BPE)");
  t = TinyTokenizer();
  t["normalizer"] = {{"type", "Sequence"},
                     {"normalizers", {{{"type", "NFC"}}, {{"type", "Lowercase"}}}}};
  EXPECT_TRUE(prl::testing::IsError(Tokenizer::FromJson(t, nullptr, nullptr).status(),
                                    absl::StatusCode::kUnimplemented,
                                    {"normalizer.normalizers[1].type", "\"Lowercase\""}));
  t = TinyTokenizer();
  t["decoder"] = {{"type", "WordPiece"}};
  EXPECT_TRUE(prl::testing::IsError(Tokenizer::FromJson(t, nullptr, nullptr).status(),
                                    absl::StatusCode::kUnimplemented,
                                    {"decoder.type", "\"WordPiece\""}));
  t = TinyTokenizer();
  t["post_processor"] = {{"type", "BertProcessing"}};
  EXPECT_TRUE(prl::testing::IsError(Tokenizer::FromJson(t, nullptr, nullptr).status(),
                                    absl::StatusCode::kUnimplemented,
                                    {"post_processor.type", "\"BertProcessing\""}));
  t = TinyTokenizer();
  t["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "MergedWithNext";
  EXPECT_TRUE(prl::testing::IsError(Tokenizer::FromJson(t, nullptr, nullptr).status(),
                                    absl::StatusCode::kUnimplemented,
                                    {"pre_tokenizer.pretokenizers[0].behavior"}));
  t = TinyTokenizer();
  t["model"]["merges"][1] = "ab zz";
  EXPECT_TRUE(prl::testing::IsError(Tokenizer::FromJson(t, nullptr, nullptr).status(),
                                    absl::StatusCode::kInvalidArgument,
                                    {"model.merges[1]", "not in the vocabulary"}));
}

TEST(TokenizerTest, BosEosAndStopIdsFollowTheConfigs) {
  json config = {
      {"bos_token", "<|x|>"}, {"eos_token", {{"content", "tok"}}}, {"add_bos_token", true}};
  auto t = Make(TinyTokenizer(), config, json{{"eos_token_id", {300, 301}}});
  EXPECT_EQ(*t->Encode("ab"), (std::vector<int32_t>{300, 256}));
  EXPECT_EQ(*t->Encode("ab", false), (std::vector<int32_t>{256}));
  EXPECT_EQ(t->stop_ids(), (std::vector<int32_t>{300, 301}));
  EXPECT_EQ(t->eos_id(), 301);
  t = Make(TinyTokenizer(), config, json{{"eos_token_id", 300}});
  EXPECT_EQ(t->stop_ids(), (std::vector<int32_t>{300}));
  t = Make(TinyTokenizer(), config);
  EXPECT_EQ(t->stop_ids(), (std::vector<int32_t>{301}));
  EXPECT_TRUE(prl::testing::IsError(
      Tokenizer::FromJson(TinyTokenizer(), config, json{{"eos_token_id", "x"}}).status(),
      absl::StatusCode::kInvalidArgument, {"generation_config.json: eos_token_id"}));
}

TEST(TokenizerTest, InvalidInputIsAnError) {
  auto t = Make(TinyTokenizer());
  EXPECT_TRUE(prl::testing::IsError(t->Encode("ok\xC3(").status(),
                                    absl::StatusCode::kInvalidArgument, {"UTF-8", "byte 2"}));
  EXPECT_TRUE(prl::testing::IsError(t->Decode(std::vector<int32_t>{1, 999}).status(),
                                    absl::StatusCode::kInvalidArgument, {"ids[1] = 999"}));
}

// Encode and Decode from many threads at once give what one thread gives (the BPE cache is
// shared).
TEST(TokenizerTest, ConcurrentEncodeAndDecodeAgree) {
  if (const std::string reason = testing::SkipReason(); !reason.empty()) GTEST_SKIP() << reason;
  auto loaded = Tokenizer::Load(testing::PackageModelDir("qwen3"));
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  const Tokenizer& t = **loaded;
  const std::vector<std::string> texts = testing::Corpus();
  std::vector<std::vector<int32_t>> expected;
  for (const std::string& text : texts) expected.push_back(*t.Encode(text));
  std::vector<std::thread> threads;
  std::vector<int> mismatches(8, 0);
  for (int w = 0; w < 8; ++w) {
    threads.emplace_back([&, w] {
      for (int round = 0; round < 20; ++round) {
        for (size_t i = (w + round) % texts.size(), n = 0; n < texts.size();
             ++n, i = (i + 1) % texts.size()) {
          auto ids = t.Encode(texts[i]);
          auto text = t.Decode(*ids);
          mismatches[w] += !ids.ok() || *ids != expected[i] || !text.ok();
        }
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (int w = 0; w < 8; ++w) EXPECT_EQ(mismatches[w], 0) << "thread " << w;
}

}  // namespace
}  // namespace prl::tokenizer

namespace prl::tokenizer {
namespace {

// The renderer converts its inputs to template values recursively: an input nested deeper than
// any bounded parse allows (core/json_input.h) is refused naming it, before any conversion.
TEST(ChatTemplateDepthTest, InputsNestedPastTheBoundAreRefusedNamingThem) {
  absl::StatusOr<ChatTemplate> t = ChatTemplate::Parse(
      "{% for m in messages %}{{ m['content'] }}{% endfor %}{{ tools | length }}");
  ASSERT_TRUE(t.ok()) << t.status();
  ChatTemplateInputs inputs;
  inputs.messages = nlohmann::ordered_json::array({{{"role", "user"}, {"content", "hi"}}});
  inputs.tools = nlohmann::ordered_json::array();
  absl::StatusOr<std::string> fine = t->Render(inputs);
  ASSERT_TRUE(fine.ok()) << fine.status();
  EXPECT_EQ(*fine, "hi0");
  // Built in place and moved, never copied (a copy recurses).
  const auto deep = [] {
    nlohmann::ordered_json value = nlohmann::ordered_json::array();
    nlohmann::ordered_json* at = &value;
    for (int i = 0; i < 100'000; ++i) at = &at->emplace_back(nlohmann::ordered_json::array());
    return value;
  };
  for (const std::string where : {"tools", "chat_template_kwargs", "messages"}) {
    ChatTemplateInputs bad = inputs;
    if (where == "tools") bad.tools = deep();
    if (where == "chat_template_kwargs") bad.extra["x"] = deep();
    if (where == "messages") bad.messages[0]["content"] = deep();
    const absl::Status refused = t->Render(bad).status();
    EXPECT_TRUE(absl::IsInvalidArgument(refused)) << where << ": " << refused;
    EXPECT_NE(refused.message().find(where + ": expected JSON nested at most 64 deep"),
              std::string::npos)
        << refused;
  }
}

}  // namespace
}  // namespace prl::tokenizer
