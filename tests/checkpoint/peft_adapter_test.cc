// PEFT adapter directories (checkpoint/peft_adapter.h): what prl writes reads back bit for bit
// with peft's config keys, and a directory prl cannot honour is an error naming the file and
// the key or tensor (the reference test, tests/reference/lora_matches_reference.sh, checks the
// semantics against an independent reader).
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <functional>
#include <fstream>
#include <string>

#include "checkpoint/peft_adapter.h"
#include "checkpoint/safetensors.h"
#include "model/lora.h"
#include "nlohmann/json.hpp"
#include "tests/checkpoint/checkpoint_testing.h"

namespace prl {
namespace {

ModelConfig Qwen2() {
  ModelConfig c;
  SetArchitecture(Architecture::kQwen2, false, &c);
  c.hidden_size = 32;
  c.intermediate_size = 48;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 8;
  c.vocab_size = 50;
  return c;
}

LoraSet Adapter() {
  LoraConfig l;
  l.rank = 4;
  l.alpha = 8;
  l.rslora = true;
  l.target_modules = {"q_proj", "down_proj"};
  LoraSet set = *LoraSet::Allocate(Qwen2(), l, Device::Cpu(), false);
  InitializeLora(set, 3);
  for (int64_t i = 0; i < set.layout.num_elements(); ++i) set.data()[i] += 0.001f * (i % 17);
  return set;
}

void EditConfig(const std::string& dir, const std::function<void(nlohmann::json&)>& edit) {
  const std::string path = dir + "/adapter_config.json";
  std::ifstream in(path);
  nlohmann::json j = nlohmann::json::parse(in);
  edit(j);
  std::ofstream(path) << j.dump();
}

TEST(PeftAdapterTest, WhatPrlWritesReadsBackBitForBitWithPeftsKeys) {
  testing::ScopedTempDir dir;
  const LoraSet set = Adapter();
  ASSERT_TRUE(SaveAdapter(dir.path(), set, "/models/base").ok());
  std::ifstream in(dir.path() + "/adapter_config.json");
  const nlohmann::json j = nlohmann::json::parse(in);
  EXPECT_EQ(j["peft_type"], "LORA");
  EXPECT_EQ(j["r"], 4);
  EXPECT_EQ(j["lora_alpha"], 8.0);
  EXPECT_EQ(j["use_rslora"], true);
  EXPECT_EQ(j["target_modules"], nlohmann::json({"q_proj", "down_proj"}));
  EXPECT_EQ(j["base_model_name_or_path"], "/models/base");
  const LoraSet back = *LoadAdapter(dir.path(), Qwen2());
  ASSERT_EQ(back.layout.num_elements(), set.layout.num_elements());
  EXPECT_EQ(0, std::memcmp(back.data(), set.data(), set.buffer.bytes()));
  EXPECT_DOUBLE_EQ(back.params.scale, set.params.scale);
}

TEST(PeftAdapterTest, AnAdapterPrlCannotHonourIsAnErrorNamingTheKeyOrTensor) {
  const LoraSet set = Adapter();
  auto error_after = [&](const std::function<void(const std::string&)>& spoil) {
    testing::ScopedTempDir dir;
    EXPECT_TRUE(SaveAdapter(dir.path(), set, "").ok());
    spoil(dir.path());
    const absl::StatusOr<LoraSet> got = LoadAdapter(dir.path(), Qwen2());
    return got.ok() ? std::string("ok") : std::string(got.status().message());
  };
  auto config = [&](const std::function<void(nlohmann::json&)>& edit) {
    return error_after([&](const std::string& d) { EditConfig(d, edit); });
  };
  auto has = [](const std::string& message, const std::string& part) {
    return message.find(part) != std::string::npos;
  };
  std::string m = config([](nlohmann::json& j) { j["use_dora"] = true; });
  EXPECT_TRUE(has(m, "use_dora: expected false (not supported), found true")) << m;
  m = config([](nlohmann::json& j) { j["bias"] = "all"; });
  EXPECT_TRUE(has(m, "bias: expected \"none\", found \"all\"")) << m;
  m = config([](nlohmann::json& j) { j["peft_type"] = "IA3"; });
  EXPECT_TRUE(has(m, "peft_type: expected \"LORA\", found \"IA3\"")) << m;
  m = config([](nlohmann::json& j) { j["rank_pattern"] = {{"q_proj", 8}}; });
  EXPECT_TRUE(has(m, "rank_pattern: expected null or empty (not supported)")) << m;
  m = config([](nlohmann::json& j) { j["target_modules"] = {"q_proj", "lm_head"}; });
  EXPECT_TRUE(has(m, "lora.target_modules: expected q_proj")) << m;
  // A target without its tensors (v_proj added to the config only).
  m = config([](nlohmann::json& j) { j["target_modules"] = {"q_proj", "v_proj", "down_proj"}; });
  EXPECT_TRUE(has(m, "missing tensor 'base_model.model.model.layers.0.self_attn.v_proj.lora_A")) << m;
  // Tensors the config does not target (q_proj removed from the config only).
  m = config([](nlohmann::json& j) { j["target_modules"] = {"down_proj"}; });
  EXPECT_TRUE(has(m, "tensor 'base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight' is "
                     "not one of")) << m;
  // The rank of the config against the tensors' shapes.
  m = config([](nlohmann::json& j) { j["r"] = 2; });
  EXPECT_TRUE(has(m, "has shape [4, 32], expected [2, 32]")) << m;
  m = error_after([](const std::string& d) {
    std::filesystem::remove(d + "/adapter_model.safetensors");
  });
  EXPECT_TRUE(has(m, "adapter_model.safetensors")) << m;
}

}  // namespace
}  // namespace prl
