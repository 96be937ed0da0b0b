// What the actor suites share: the tiny model they generate with.
#pragma once

#include "model/config.h"
#include "task/char_tokenizer.h"

namespace prl::actor {

// A one-layer Qwen2 over the built-in character tokenizer's vocabulary (the arithmetic task's
// text), small enough for a test to generate many groups.
inline ModelConfig TinyCharModel() {
  ModelConfig c;
  c.arch = Architecture::kQwen2;
  c.hidden_size = 32;
  c.intermediate_size = 64;
  c.num_hidden_layers = 1;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 8;
  c.vocab_size = task::CharTokenizer().vocab_size();
  c.max_position_embeddings = 64;
  c.tie_word_embeddings = true;
  c.qkv_bias = true;
  return c;
}

}  // namespace prl::actor
