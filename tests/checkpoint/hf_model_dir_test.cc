#include "checkpoint/hf_model_dir.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "checkpoint/safetensors.h"
#include "core/dtype.h"
#include "core/mapped_file.h"
#include "nlohmann/json.hpp"
#include "tests/checkpoint/checkpoint_testing.h"
#include "tests/status_testing.h"

namespace prl {
namespace {

namespace fs = std::filesystem;
using ::prl::testing::F32Bytes;
using ::prl::testing::IsError;
using ::prl::testing::RawTensor;
using ::prl::testing::SafetensorsBytes;
using ::prl::testing::ScopedTempDir;
using ::prl::testing::WriteBytes;

constexpr absl::StatusCode kInvalid = absl::StatusCode::kInvalidArgument;
constexpr absl::StatusCode kNotFound = absl::StatusCode::kNotFound;

// Qwen2: q/k/v biases, untied head, GQA (2 heads share 1 KV head).
ModelConfig TinyQwen2() {
  ModelConfig c;
  c.arch = Architecture::kQwen2;
  c.hidden_size = 8;
  c.intermediate_size = 12;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 1;
  c.head_dim = 4;
  c.vocab_size = 10;
  c.max_position_embeddings = 64;
  c.qkv_bias = true;
  c.tie_word_embeddings = false;
  c.passthrough = {{"bos_token_id", "1"}, {"torch_dtype", R"("bfloat16")"}};
  return c;
}

// Llama: no biases, lm_head tied to the embedding.
ModelConfig TinyTiedLlama() {
  ModelConfig c = TinyQwen2();
  c.arch = Architecture::kLlama;
  c.qkv_bias = false;
  c.tie_word_embeddings = true;
  return c;
}

// Qwen3: per-head q/k norms, attention_bias (q/k/v and o_proj biases), head_dim 8 != hidden /
// heads = 4, tied embeddings (as Qwen3-0.6B).
ModelConfig TinyQwen3() {
  ModelConfig c = TinyQwen2();
  SetArchitecture(Architecture::kQwen3, /*attention_bias=*/true, &c);
  c.head_dim = 8;
  c.tie_word_embeddings = true;
  return c;
}

// Random weights; norms and biases moved off their 1 / 0 init so that they round-trip
// something distinguishable.
ParameterSet MakeParams(const ModelConfig& config, uint64_t seed) {
  absl::StatusOr<ParameterSet> set = ParameterSet::Allocate(config, Device::Cpu(), false);
  EXPECT_TRUE(set.ok()) << set.status();
  InitializeParameters(*set, seed, 0.5f);
  for (const ParamEntry& e : set->layout.entries()) {
    if (e.name.ends_with("norm.weight") || e.name.ends_with(".bias")) {
      for (int64_t i = 0; i < e.numel; ++i) set->data()[e.offset + i] += 0.01f * (i + 1);
    }
  }
  return *std::move(set);
}

std::vector<float> Values(const ParameterSet& set) {
  return std::vector<float>(set.data(), set.data() + set.layout.num_elements());
}

// Loads `dir` and checks that it holds exactly `expected` (bit for bit) under `config`.
void ExpectLoadsAs(const std::string& dir, const ModelConfig& config,
                   const std::vector<float>& expected) {
  absl::StatusOr<ParameterSet> loaded = LoadModel(dir, Device::Cpu());
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->config.arch, config.arch);
  EXPECT_EQ(loaded->config.tie_word_embeddings, config.tie_word_embeddings);
  EXPECT_EQ(loaded->config.passthrough, config.passthrough);
  ASSERT_EQ(loaded->layout.num_elements(), static_cast<int64_t>(expected.size()));
  const std::vector<float> got = Values(*loaded);
  for (size_t i = 0; i < expected.size(); ++i) {
    ASSERT_EQ(BitsFromF32(got[i]), BitsFromF32(expected[i])) << "element " << i;
  }
}

// The tensors of `set` as raw F32 tensors, for hand-built files.
std::vector<RawTensor> RawTensors(const ParameterSet& set) {
  std::vector<RawTensor> tensors;
  for (const ParamEntry& e : set.layout.entries()) {
    tensors.push_back(
        {e.name, "F32", e.shape, F32Bytes(absl::MakeConstSpan(set.data() + e.offset, e.numel))});
  }
  return tensors;
}

// A model directory with config.json of `config` and `tensors` in model.safetensors.
void WriteModelDir(const std::string& dir, const ModelConfig& config,
                   const std::vector<RawTensor>& tensors) {
  ASSERT_TRUE(WriteFileAtomically(dir + "/config.json", ModelConfigToJson(config)).ok());
  WriteBytes(dir + "/model.safetensors", SafetensorsBytes(tensors));
}

std::set<std::string> FileNames(const std::string& dir) {
  std::set<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.insert(e.path().filename().string());
  return names;
}

nlohmann::json ReadJson(const std::string& path) {
  absl::StatusOr<std::string> text = ReadFileToString(path);
  EXPECT_TRUE(text.ok()) << text.status();
  return nlohmann::json::parse(text.value_or("null"));
}

// ---- Round trips ---------------------------------------------------------------------------

TEST(HfModelDirTest, F32SaveLoadsBackBitExact) {
  ScopedTempDir dir;
  const ParameterSet set = MakeParams(TinyQwen2(), 1);
  ASSERT_TRUE(SaveModel(dir.path(), set).ok());
  EXPECT_EQ(FileNames(dir.path()), (std::set<std::string>{"config.json", "model.safetensors"}));
  ExpectLoadsAs(dir.path(), set.config, Values(set));
}

TEST(HfModelDirTest, TiedSaveHasNoLmHeadAndLoadsBackBitExact) {
  ScopedTempDir dir;
  const ParameterSet set = MakeParams(TinyTiedLlama(), 2);
  ASSERT_TRUE(SaveModel(dir.path(), set).ok());
  absl::StatusOr<SafetensorsFile> file = SafetensorsFile::Open(dir.File("model.safetensors"));
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->header().Find("lm_head.weight"), nullptr);
  EXPECT_EQ(file->header().Find("model.layers.0.self_attn.q_proj.bias"), nullptr);
  EXPECT_EQ(file->header().tensors.size(), set.layout.entries().size());
  using Pair = std::pair<std::string, std::string>;
  EXPECT_EQ(file->header().metadata, (std::vector<Pair>{{"format", "pt"}}));
  ExpectLoadsAs(dir.path(), set.config, Values(set));
}

// What a save in `dtype` should load back as: every value rounded to `dtype` and widened.
std::vector<float> Rounded(const std::vector<float>& values, DType dtype) {
  std::vector<float> rounded(values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    rounded[i] =
        dtype == DType::kBF16 ? Bf16ToF32(F32ToBf16(values[i])) : F16ToF32(F32ToF16(values[i]));
  }
  return rounded;
}

TEST(HfModelDirTest, Bf16SaveLoadsBackTheRoundedValues) {
  ScopedTempDir dir;
  const ParameterSet set = MakeParams(TinyQwen2(), 3);
  ASSERT_TRUE(SaveModel(dir.path(), set, {.dtype = DType::kBF16}).ok());
  absl::StatusOr<SafetensorsFile> file = SafetensorsFile::Open(dir.File("model.safetensors"));
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->header().tensors[0].dtype, "BF16");
  const std::vector<float> expected = Rounded(Values(set), DType::kBF16);
  EXPECT_NE(expected, Values(set));  // the rounding is visible
  ExpectLoadsAs(dir.path(), set.config, expected);
}

TEST(HfModelDirTest, F16SaveLoadsBackTheRoundedValues) {
  ScopedTempDir dir;
  const ParameterSet set = MakeParams(TinyTiedLlama(), 4);
  ASSERT_TRUE(SaveModel(dir.path(), set, {.dtype = DType::kF16}).ok());
  const std::vector<float> expected = Rounded(Values(set), DType::kF16);
  EXPECT_NE(expected, Values(set));
  ExpectLoadsAs(dir.path(), set.config, expected);
}

std::string ShardName(int k, int n) {
  return absl::StrFormat("model-%05d-of-%05d.safetensors", k, n);
}

TEST(HfModelDirTest, ShardedSaveWritesAnIndexAndShardsAndLoadsBackBitExact) {
  ScopedTempDir dir;
  const ParameterSet set = MakeParams(TinyQwen2(), 5);
  ASSERT_TRUE(SaveModel(dir.path(), set).ok());  // leaves a model.safetensors behind
  const uint64_t max_shard_bytes = 512;
  ASSERT_TRUE(SaveModel(dir.path(), set, {.max_shard_bytes = max_shard_bytes}).ok());

  const nlohmann::json index = ReadJson(dir.File("model.safetensors.index.json"));
  ASSERT_TRUE(index.contains("weight_map")) << index.dump();
  EXPECT_EQ(index["metadata"]["total_size"].get<int64_t>(), set.layout.num_elements() * 4);
  std::set<std::string> shards;
  for (const auto& [name, file] : index["weight_map"].items()) shards.insert(file);
  const int n = static_cast<int>(shards.size());
  ASSERT_GT(n, 2);
  std::set<std::string> expected_files = {"config.json", "model.safetensors.index.json"};
  for (int k = 1; k <= n; ++k) {
    EXPECT_TRUE(shards.count(ShardName(k, n))) << ShardName(k, n);
    expected_files.insert(ShardName(k, n));
  }
  // The stale single file is gone: a loader would prefer it over the index.
  EXPECT_EQ(FileNames(dir.path()), expected_files);

  // Every tensor is in the shard the index names; a shard exceeds the limit only when it holds
  // a single tensor larger than the limit.
  size_t tensors_in_shards = 0;
  for (const std::string& shard : shards) {
    absl::StatusOr<SafetensorsFile> f = SafetensorsFile::Open(dir.File(shard));
    ASSERT_TRUE(f.ok()) << f.status();
    for (const SafetensorsEntry& e : f->header().tensors) {
      EXPECT_EQ(index["weight_map"][e.name], shard) << e.name;
    }
    tensors_in_shards += f->header().tensors.size();
    if (f->header().data_size > max_shard_bytes) {
      EXPECT_EQ(f->header().tensors.size(), 1u) << shard;
    }
  }
  EXPECT_EQ(tensors_in_shards, set.layout.entries().size());
  EXPECT_EQ(index["weight_map"].size(), set.layout.entries().size());

  ExpectLoadsAs(dir.path(), set.config, Values(set));
}

// Qwen3's own tensors (q_norm, k_norm, o_proj.bias) are written under transformers' names and
// shapes and come back bit for bit, from one file and from shards.
TEST(HfModelDirTest, Qwen3SaveWritesTransformersNamesAndLoadsBackBitExactSingleAndSharded) {
  const ParameterSet set = MakeParams(TinyQwen3(), 20);
  for (const uint64_t max_shard_bytes : {uint64_t{0}, uint64_t{512}}) {
    SCOPED_TRACE(max_shard_bytes);
    ScopedTempDir dir;
    ASSERT_TRUE(SaveModel(dir.path(), set, {.max_shard_bytes = max_shard_bytes}).ok());
    const nlohmann::json config = ReadJson(dir.File("config.json"));
    EXPECT_EQ(config["architectures"], nlohmann::json::array({"Qwen3ForCausalLM"}));
    EXPECT_EQ(config["model_type"], "qwen3");
    EXPECT_EQ(config["attention_bias"], true);
    EXPECT_EQ(config["head_dim"], 8);
    std::vector<std::string> files = {"model.safetensors"};
    if (max_shard_bytes > 0) {
      const nlohmann::json index = ReadJson(dir.File("model.safetensors.index.json"));
      std::set<std::string> shards;
      for (const auto& [name, file] : index["weight_map"].items()) shards.insert(file);
      ASSERT_GT(shards.size(), 2u);
      files.assign(shards.begin(), shards.end());
    }
    std::map<std::string, std::vector<int64_t>> shapes;
    for (const std::string& file : files) {
      absl::StatusOr<SafetensorsFile> f = SafetensorsFile::Open(dir.File(file));
      ASSERT_TRUE(f.ok()) << f.status();
      for (const SafetensorsEntry& e : f->header().tensors) shapes[e.name] = e.shape;
    }
    using Shape = std::vector<int64_t>;
    EXPECT_EQ(shapes["model.layers.1.self_attn.q_norm.weight"], (Shape{8}));
    EXPECT_EQ(shapes["model.layers.1.self_attn.k_norm.weight"], (Shape{8}));
    EXPECT_EQ(shapes["model.layers.1.self_attn.o_proj.bias"], (Shape{8}));
    EXPECT_EQ(shapes["model.layers.1.self_attn.o_proj.weight"], (Shape{8, 16}));
    EXPECT_EQ(shapes["model.layers.1.self_attn.q_proj.weight"], (Shape{16, 8}));
    EXPECT_EQ(shapes.size(), set.layout.entries().size());
    ExpectLoadsAs(dir.path(), set.config, Values(set));
    absl::StatusOr<ParameterSet> loaded = LoadModel(dir.path(), Device::Cpu());
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    EXPECT_TRUE(loaded->config.qk_norm);
    EXPECT_TRUE(loaded->config.o_bias);
    EXPECT_EQ(loaded->config.head_dim, 8);
  }
}

// Qwen3-MoE: 3 experts (top 2, renormalised) of width 6 in layer 1; layer 0 is dense
// (mlp_only_layers), untied.
TEST(HfModelDirTest, Qwen3MoeSaveWritesPerExpertTransformersNamesAndLoadsBackBitExact) {
  ModelConfig c = TinyQwen2();
  SetArchitecture(Architecture::kQwen3Moe, /*attention_bias=*/false, &c);
  c.num_experts = 3;
  c.num_experts_per_tok = 2;
  c.moe_intermediate_size = 6;
  c.norm_topk_prob = true;
  c.mlp_only_layers = {0};
  const ParameterSet set = MakeParams(c, 21);
  for (const uint64_t max_shard_bytes : {uint64_t{0}, uint64_t{256}}) {
    SCOPED_TRACE(max_shard_bytes);
    ScopedTempDir dir;
    ASSERT_TRUE(SaveModel(dir.path(), set, {.max_shard_bytes = max_shard_bytes}).ok());
    const nlohmann::json config = ReadJson(dir.File("config.json"));
    EXPECT_EQ(config["architectures"], nlohmann::json::array({"Qwen3MoeForCausalLM"}));
    EXPECT_EQ(config["model_type"], "qwen3_moe");
    EXPECT_EQ(config["num_experts"], 3);
    EXPECT_EQ(config["mlp_only_layers"], nlohmann::json::array({0}));
    std::vector<std::string> files = {"model.safetensors"};
    if (max_shard_bytes > 0) {
      const nlohmann::json index = ReadJson(dir.File("model.safetensors.index.json"));
      std::set<std::string> shards;
      for (const auto& [name, file] : index["weight_map"].items()) shards.insert(file);
      ASSERT_GT(shards.size(), 2u);
      files.assign(shards.begin(), shards.end());
    }
    std::map<std::string, std::vector<int64_t>> shapes;
    for (const std::string& file : files) {
      absl::StatusOr<SafetensorsFile> f = SafetensorsFile::Open(dir.File(file));
      ASSERT_TRUE(f.ok()) << f.status();
      for (const SafetensorsEntry& e : f->header().tensors) shapes[e.name] = e.shape;
    }
    using Shape = std::vector<int64_t>;
    EXPECT_EQ(shapes["model.layers.0.mlp.gate_proj.weight"], (Shape{12, 8}));
    EXPECT_EQ(shapes["model.layers.1.mlp.gate.weight"], (Shape{3, 8}));
    EXPECT_EQ(shapes["model.layers.1.mlp.experts.2.gate_proj.weight"], (Shape{6, 8}));
    EXPECT_EQ(shapes["model.layers.1.mlp.experts.2.up_proj.weight"], (Shape{6, 8}));
    EXPECT_EQ(shapes["model.layers.1.mlp.experts.2.down_proj.weight"], (Shape{8, 6}));
    EXPECT_EQ(shapes.size(), set.layout.entries().size());
    ExpectLoadsAs(dir.path(), set.config, Values(set));
    absl::StatusOr<ParameterSet> loaded = LoadModel(dir.path(), Device::Cpu());
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    EXPECT_EQ(loaded->config.num_experts, 3);
    EXPECT_TRUE(loaded->config.norm_topk_prob);
    EXPECT_TRUE(loaded->config.IsMoeLayer(1));
    EXPECT_FALSE(loaded->config.IsMoeLayer(0));
  }
}

// Qwen/Qwen3-0.6B ships lm_head.weight beside tied embeddings, in a sharded layout for the
// larger sizes: it loads, and the head stays the embedding.
TEST(HfModelDirTest, ShardedQwen3WithTiedEmbeddingsAndAStoredLmHeadLoads) {
  ScopedTempDir dir;
  const ParameterSet set = MakeParams(TinyQwen3(), 21);
  ASSERT_TRUE(WriteFileAtomically(dir.File("config.json"), ModelConfigToJson(set.config)).ok());
  std::vector<RawTensor> tensors = RawTensors(set);
  std::vector<float> head(10 * 8, 7.0f);
  tensors.push_back({"lm_head.weight", "F32", {10, 8}, F32Bytes(head)});
  std::vector<RawTensor> first, second;
  nlohmann::json weight_map;
  for (RawTensor& t : tensors) {
    const bool in_second = t.name.starts_with("model.layers.1.") || t.name == "lm_head.weight";
    weight_map[t.name] =
        in_second ? "model-00002-of-00002.safetensors" : "model-00001-of-00002.safetensors";
    (in_second ? second : first).push_back(std::move(t));
  }
  WriteBytes(dir.File("model-00001-of-00002.safetensors"), SafetensorsBytes(first));
  WriteBytes(dir.File("model-00002-of-00002.safetensors"), SafetensorsBytes(second));
  const nlohmann::json index = {{"metadata", {{"total_size", 0}}}, {"weight_map", weight_map}};
  ASSERT_TRUE(WriteFileAtomically(dir.File("model.safetensors.index.json"), index.dump()).ok());
  ExpectLoadsAs(dir.path(), set.config, Values(set));
}

TEST(HfModelDirTest, UnshardedSaveAfterAShardedOneRemovesTheStaleIndexAndShards) {
  ScopedTempDir dir;
  const ParameterSet old_set = MakeParams(TinyQwen2(), 6);
  ASSERT_TRUE(SaveModel(dir.path(), old_set, {.max_shard_bytes = 512}).ok());
  ASSERT_TRUE(fs::exists(dir.File("model.safetensors.index.json")));
  const ParameterSet set = MakeParams(TinyQwen2(), 7);
  ASSERT_TRUE(SaveModel(dir.path(), set).ok());
  EXPECT_EQ(FileNames(dir.path()), (std::set<std::string>{"config.json", "model.safetensors"}));
  ExpectLoadsAs(dir.path(), set.config, Values(set));
}

TEST(HfModelDirTest, ReshardingRemovesShardsOfTheEarlierLayout) {
  ScopedTempDir dir;
  const ParameterSet set = MakeParams(TinyQwen2(), 8);
  ASSERT_TRUE(SaveModel(dir.path(), set, {.max_shard_bytes = 256}).ok());
  const size_t fine = FileNames(dir.path()).size();
  ASSERT_TRUE(SaveModel(dir.path(), set, {.max_shard_bytes = 2048}).ok());
  const std::set<std::string> names = FileNames(dir.path());
  ASSERT_LT(names.size(), fine);
  const nlohmann::json index = ReadJson(dir.File("model.safetensors.index.json"));
  std::set<std::string> expected = {"config.json", "model.safetensors.index.json"};
  for (const auto& [name, file] : index["weight_map"].items()) expected.insert(file);
  EXPECT_EQ(names, expected);
  ExpectLoadsAs(dir.path(), set.config, Values(set));
}

TEST(HfModelDirTest, SaveParameterSetTensorsWritesEveryTensorAsF32) {
  ScopedTempDir dir;
  const ParameterSet set = MakeParams(TinyTiedLlama(), 9);
  const std::string path = dir.File("grads.safetensors");
  ASSERT_TRUE(SaveParameterSetTensors(path, set).ok());
  absl::StatusOr<SafetensorsFile> file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  ASSERT_EQ(file->header().tensors.size(), set.layout.entries().size());
  for (const ParamEntry& p : set.layout.entries()) {
    const SafetensorsEntry* e = file->header().Find(p.name);
    ASSERT_NE(e, nullptr) << p.name;
    EXPECT_EQ(e->dtype, "F32");
    EXPECT_EQ(e->shape, p.shape);
    EXPECT_EQ(0, std::memcmp(file->Data(*e).data(), set.data() + p.offset, p.numel * 4));
  }
}

// ---- Checkpoints that must not load --------------------------------------------------------

TEST(HfModelDirTest, MissingTensorIsNotFoundNamingItAndItsShape) {
  ScopedTempDir dir;
  const ParameterSet set = MakeParams(TinyQwen2(), 10);
  std::vector<RawTensor> tensors = RawTensors(set);
  std::erase_if(tensors,
                [](const RawTensor& t) { return t.name == "model.layers.1.mlp.up_proj.weight"; });
  WriteModelDir(dir.path(), set.config, tensors);
  EXPECT_TRUE(
      IsError(LoadModel(dir.path(), Device::Cpu()).status(), kNotFound,
              {dir.path(), "missing tensor 'model.layers.1.mlp.up_proj.weight'", "[12, 8]"}));
}

// A Qwen2 checkpoint relabelled as Qwen3 lacks the q/k norms: refused, not run without them.
TEST(HfModelDirTest, Qwen3WithoutQkNormsIsNotFoundNamingTheTensor) {
  ScopedTempDir dir;
  const ParameterSet set = MakeParams(TinyQwen3(), 22);
  std::vector<RawTensor> tensors = RawTensors(set);
  std::erase_if(tensors, [](const RawTensor& t) {
    return t.name.ends_with("_norm.weight") && t.name.find("self_attn") != t.name.npos;
  });
  WriteModelDir(dir.path(), set.config, tensors);
  EXPECT_TRUE(IsError(LoadModel(dir.path(), Device::Cpu()).status(), kNotFound,
                      {"missing tensor 'model.layers.0.self_attn.q_norm.weight'", "[8]"}));
}

TEST(HfModelDirTest, UntiedConfigWithoutLmHeadIsNotFound) {
  ScopedTempDir dir;
  ModelConfig untied = TinyTiedLlama();
  untied.tie_word_embeddings = false;
  const ParameterSet tied = MakeParams(TinyTiedLlama(), 11);
  WriteModelDir(dir.path(), untied, RawTensors(tied));
  EXPECT_TRUE(IsError(LoadModel(dir.path(), Device::Cpu()).status(), kNotFound,
                      {"missing tensor 'lm_head.weight'"}));
}

TEST(HfModelDirTest, WrongShapeIsAnErrorNamingTheTensorAndBothShapes) {
  ScopedTempDir dir;
  const ParameterSet set = MakeParams(TinyQwen2(), 12);
  std::vector<RawTensor> tensors = RawTensors(set);
  for (RawTensor& t : tensors) {
    if (t.name == "model.layers.0.self_attn.o_proj.weight") t.shape = {4, 16};  // same numel
  }
  WriteModelDir(dir.path(), set.config, tensors);
  EXPECT_TRUE(IsError(LoadModel(dir.path(), Device::Cpu()).status(), kInvalid,
                      {dir.File("model.safetensors"), "'model.layers.0.self_attn.o_proj.weight'",
                       "shape [4, 16]", "implies [8, 8]"}));
}

TEST(HfModelDirTest, UnsupportedDtypeIsAnErrorNamingTheTensorAndDtype) {
  ScopedTempDir dir;
  const ParameterSet set = MakeParams(TinyQwen2(), 13);
  std::vector<RawTensor> tensors = RawTensors(set);
  for (RawTensor& t : tensors) {
    if (t.name == "model.norm.weight") {
      t.dtype = "I64";
      t.bytes.assign(8 * 8, 0);  // 8 int64 zeros
    }
  }
  WriteModelDir(dir.path(), set.config, tensors);
  EXPECT_TRUE(IsError(LoadModel(dir.path(), Device::Cpu()).status(), kInvalid,
                      {dir.File("model.safetensors"), "'model.norm.weight'", "dtype I64"}));

  // I32 is a prl dtype, but not a parameter one.
  for (RawTensor& t : tensors) {
    if (t.name == "model.norm.weight") {
      t.dtype = "I32";
      t.bytes.assign(8 * 4, 0);
    }
  }
  WriteModelDir(dir.path(), set.config, tensors);
  EXPECT_TRUE(IsError(LoadModel(dir.path(), Device::Cpu()).status(), kInvalid,
                      {"'model.norm.weight'", "dtype I32"}));
}

TEST(HfModelDirTest, UnexpectedExtraTensorIsAnErrorNamingIt) {
  ScopedTempDir dir;
  const ParameterSet set = MakeParams(TinyQwen2(), 14);
  std::vector<RawTensor> tensors = RawTensors(set);
  tensors.push_back(
      {"model.layers.2.input_layernorm.weight", "F32", {8}, std::vector<uint8_t>(8 * 4, 0)});
  WriteModelDir(dir.path(), set.config, tensors);
  EXPECT_TRUE(
      IsError(LoadModel(dir.path(), Device::Cpu()).status(), kInvalid,
              {"model.safetensors", "unexpected tensor 'model.layers.2.input_layernorm.weight'",
               "Qwen2ForCausalLM"}));
}

TEST(HfModelDirTest, LmHeadWithTiedEmbeddingsIsIgnored) {
  ScopedTempDir dir;
  const ParameterSet set = MakeParams(TinyTiedLlama(), 15);
  std::vector<RawTensor> tensors = RawTensors(set);
  std::vector<float> head(10 * 8, 7.0f);  // differs from the embedding: must not be used
  tensors.push_back({"lm_head.weight", "F32", {10, 8}, F32Bytes(head)});
  WriteModelDir(dir.path(), set.config, tensors);
  ExpectLoadsAs(dir.path(), set.config, Values(set));
}

TEST(HfModelDirTest, RotaryInvFreqBufferIsIgnored) {
  ScopedTempDir dir;
  const ParameterSet set = MakeParams(TinyQwen2(), 17);
  std::vector<RawTensor> tensors = RawTensors(set);
  const std::vector<float> inv_freq = {1.0f, 0.01f};
  tensors.push_back(
      {"model.layers.0.self_attn.rotary_emb.inv_freq", "F32", {2}, F32Bytes(inv_freq)});
  WriteModelDir(dir.path(), set.config, tensors);
  ExpectLoadsAs(dir.path(), set.config, Values(set));
}

// Writes a sharded checkpoint of `set` with `edit` applied to the parsed index.
template <typename Edit>
void SaveShardedAndEditIndex(const std::string& dir, const ParameterSet& set, Edit edit) {
  ASSERT_TRUE(SaveModel(dir, set, {.max_shard_bytes = 512}).ok());
  const std::string path = dir + "/model.safetensors.index.json";
  nlohmann::json index = ReadJson(path);
  edit(index);
  ASSERT_TRUE(WriteFileAtomically(path, index.dump(2)).ok());
}

TEST(HfModelDirTest, IndexMappingATensorToAShardWithoutItIsAnError) {
  ScopedTempDir dir;
  const ParameterSet set = MakeParams(TinyQwen2(), 18);
  // The embedding (first shard) claimed to live in the last shard.
  std::string last;
  SaveShardedAndEditIndex(dir.path(), set, [&](nlohmann::json& index) {
    for (const auto& [name, file] : index["weight_map"].items())
      last = std::max(last, file.get<std::string>());
    index["weight_map"]["model.embed_tokens.weight"] = last;
  });
  EXPECT_TRUE(
      IsError(LoadModel(dir.path(), Device::Cpu()).status(), kInvalid,
              {"model-00001-of-", "'model.embed_tokens.weight'", "not mapped to this file"}));
}

TEST(HfModelDirTest, IndexNamingATensorNoShardHoldsIsAnErrorNamingTheShard) {
  ScopedTempDir dir;
  const ParameterSet set = MakeParams(TinyQwen2(), 19);
  const ModelConfig& config = set.config;
  ASSERT_TRUE(WriteFileAtomically(dir.File("config.json"), ModelConfigToJson(config)).ok());
  std::vector<RawTensor> tensors = RawTensors(set);
  std::vector<RawTensor> first, second;
  nlohmann::json weight_map;
  for (RawTensor& t : tensors) {
    if (t.name == "model.norm.weight") {
      weight_map[t.name] = "b.safetensors";  // ...which does not hold it
      continue;
    }
    const bool in_b = t.name == "lm_head.weight";
    weight_map[t.name] = in_b ? "b.safetensors" : "a.safetensors";
    (in_b ? second : first).push_back(std::move(t));
  }
  WriteBytes(dir.File("a.safetensors"), SafetensorsBytes(first));
  WriteBytes(dir.File("b.safetensors"), SafetensorsBytes(second));
  const nlohmann::json index = {{"weight_map", weight_map}};
  ASSERT_TRUE(WriteFileAtomically(dir.File("model.safetensors.index.json"), index.dump()).ok());
  EXPECT_TRUE(IsError(LoadModel(dir.path(), Device::Cpu()).status(), kNotFound,
                      {dir.File("b.safetensors"), "missing tensor 'model.norm.weight'"}));
}

TEST(HfModelDirTest, IndexFileNameEscapingTheDirectoryIsRejected) {
  for (const char* escape : {"../model-00001-of-00002.safetensors", "/etc/passwd", "..", ""}) {
    SCOPED_TRACE(escape);
    ScopedTempDir dir;
    const ParameterSet set = MakeParams(TinyQwen2(), 20);
    SaveShardedAndEditIndex(dir.path(), set, [&](nlohmann::json& index) {
      index["weight_map"]["model.norm.weight"] = escape;
    });
    EXPECT_TRUE(IsError(LoadModel(dir.path(), Device::Cpu()).status(), kInvalid,
                        {"model.safetensors.index.json", "weight_map['model.norm.weight']",
                         "not a file in the directory"}));
  }
}

TEST(HfModelDirTest, MalformedIndexIsAnErrorNamingTheIndex) {
  ScopedTempDir dir;
  const ParameterSet set = MakeParams(TinyQwen2(), 21);
  SaveShardedAndEditIndex(dir.path(), set, [](nlohmann::json& index) {
    index = {{"weights", index["weight_map"]}};
  });
  EXPECT_TRUE(IsError(LoadModel(dir.path(), Device::Cpu()).status(), kInvalid,
                      {"model.safetensors.index.json", "'weight_map'"}));
  ASSERT_TRUE(
      WriteFileAtomically(dir.File("model.safetensors.index.json"), "{\"weight_map\":").ok());
  EXPECT_TRUE(IsError(LoadModel(dir.path(), Device::Cpu()).status(), kInvalid,
                      {"model.safetensors.index.json", "malformed JSON"}));
}

TEST(HfModelDirTest, DirectoryWithoutWeightsIsNotFound) {
  ScopedTempDir dir;
  ASSERT_TRUE(WriteFileAtomically(dir.File("config.json"), ModelConfigToJson(TinyQwen2())).ok());
  EXPECT_TRUE(IsError(LoadModel(dir.path(), Device::Cpu()).status(), kNotFound,
                      {dir.path(), "model.safetensors", "model.safetensors.index.json"}));
}

TEST(HfModelDirTest, DirectoryWithoutConfigIsNotFound) {
  ScopedTempDir dir;
  const ParameterSet set = MakeParams(TinyQwen2(), 22);
  ASSERT_TRUE(SaveModel(dir.path(), set).ok());
  fs::remove(dir.File("config.json"));
  EXPECT_TRUE(
      IsError(LoadModel(dir.path(), Device::Cpu()).status(), kNotFound, {dir.File("config.json")}));
  EXPECT_TRUE(IsError(ReadModelConfig(dir.path()).status(), kNotFound, {"config.json"}));
}

TEST(HfModelDirTest, TruncatedWeightsFileIsAnErrorNamingTheFile) {
  ScopedTempDir dir;
  const ParameterSet set = MakeParams(TinyQwen2(), 23);
  ASSERT_TRUE(SaveModel(dir.path(), set).ok());
  const std::string path = dir.File("model.safetensors");
  fs::resize_file(path, fs::file_size(path) - 4);
  EXPECT_TRUE(
      IsError(LoadModel(dir.path(), Device::Cpu()).status(), kInvalid, {path, "truncated"}));
}

}  // namespace
}  // namespace prl
