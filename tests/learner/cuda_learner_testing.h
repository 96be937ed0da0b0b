// What the learner's GPU tests share (cuda_learner_test.cc, cuda_lora_learner_test.cc): a tiny
// Qwen2 model (GQA, biases, tied), six samples with advantages, the same on every backend, and
// how a figure is recorded.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "learner/train_step.h"
#include "model/config.h"

namespace prl::learner::testing {

inline ModelConfig GpuTestConfig() {
  ModelConfig c;
  c.arch = Architecture::kQwen2;
  c.hidden_size = 128;
  c.intermediate_size = 384;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 32;
  c.vocab_size = 300;
  c.max_position_embeddings = 512;
  c.tie_word_embeddings = true;
  c.qkv_bias = true;
  return c;
}

inline std::vector<TrainSample> GpuTestSamples(const ModelConfig& c) {
  std::mt19937_64 rng(11);
  std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(c.vocab_size) - 1);
  std::uniform_real_distribution<float> lp(-8.0f, -3.0f);
  std::vector<TrainSample> samples;
  const int prompt_lens[] = {5, 17, 3, 40, 9, 12};
  const int completion_lens[] = {30, 8, 60, 25, 1, 44};
  for (int i = 0; i < 6; ++i) {
    TrainSample s;
    for (int t = 0; t < prompt_lens[i]; ++t) s.prompt.push_back(tok(rng));
    for (int t = 0; t < completion_lens[i]; ++t) {
      s.completion.push_back(tok(rng));
      s.behaviour_logprobs.push_back(lp(rng));
    }
    s.has_advantage = true;
    s.advantage = i % 2 == 0 ? 1.0 : -0.7;
    samples.push_back(std::move(s));
  }
  return samples;
}

// A measured figure, as a gtest property (gpu_check's table) and on stdout.
inline void RecordFigure(const std::string& name, double value) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.3e", value);
  ::testing::Test::RecordProperty(name, buf);
  std::printf("%s %s\n", name.c_str(), buf);
}

}  // namespace prl::learner::testing
