// Tests against Qwen3's real tokenizer and chat template (the npm reference packages of
// scripts/setup_test_references.sh; skipped, naming the script, without them): the codec, and
// the reference token ids of a chat — @huggingface/jinja renders the package's template,
// transformers.js encodes the text.
#pragma once

#include <gtest/gtest.h>

#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"
#include "tests/tokenizer/js_reference.h"
#include "tokenizer/hf_text_codec.h"

namespace prl::episode::testing {

class Qwen3Test : public ::testing::Test {
 protected:
  using Json = nlohmann::ordered_json;

  void SetUp() override {
    if (const std::string reason = tokenizer::testing::SkipReason(); !reason.empty()) {
      GTEST_SKIP() << reason;
    }
    auto codec = tokenizer::HfTextCodec::Load(tokenizer::testing::PackageModelDir("qwen3"));
    ASSERT_TRUE(codec.ok()) << codec.status();
    codec_ = std::move(*codec);
  }

  // The reference rendering of a template context ({"messages", "tools"?,
  // "add_generation_prompt"?, ...}) as text, and as token ids.
  static std::string ReferenceText(const Json& context) {
    std::ifstream in(tokenizer::testing::PackageModelDir("qwen3") + "/tokenizer_config.json");
    std::stringstream config;
    config << in.rdbuf();
    const std::string source = Json::parse(config.str())["chat_template"].get<std::string>();
    auto rendered = tokenizer::testing::RunReference(
        "render", {}, Json::array({{{"template", source}, {"context", context}}}));
    EXPECT_TRUE(rendered.ok()) << rendered.status();
    if (!rendered.ok() || !(*rendered)[0].contains("text")) return "";
    return (*rendered)[0]["text"].get<std::string>();
  }
  static std::vector<int32_t> ReferenceIds(const Json& context) {
    auto encoded = tokenizer::testing::RunReference(
        "encode", {tokenizer::testing::PackageModelDir("qwen3")},
        Json::array({ReferenceText(context)}));
    EXPECT_TRUE(encoded.ok()) << encoded.status();
    if (!encoded.ok()) return {};
    return (*encoded)[0]["ids_plain"].get<std::vector<int32_t>>();
  }

  std::unique_ptr<tokenizer::HfTextCodec> codec_;
};

}  // namespace prl::episode::testing
