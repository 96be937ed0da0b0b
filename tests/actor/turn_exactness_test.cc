// Token exactness across turns with a real chat template (Qwen3's, from the npm references):
// an episode's record is exactly the prompt, the engine's sampled tokens and the environment's
// replies rendered as deltas (episode/turn_renderer.h), in order; rendering the whole
// conversation again at the end tokenizes differently (the drift prl avoids), and the
// learner's log-probs of the turn-by-turn tokens equal the behaviour log-probs (fp32 CPU).
#include <gtest/gtest.h>

#include "episode/turn_renderer.h"
#include "inference_engine/engine.h"
#include "model/transformer.h"
#include "tests/tokenizer/js_reference.h"
#include "tokenizer/hf_text_codec.h"

namespace prl::episode {
namespace {

v1::EnvMessage Tool(const std::string& content) {
  v1::EnvMessage m;
  m.set_role("tool");
  m.set_name("calculator");
  m.set_content(content);
  return m;
}

TEST(TurnExactnessTest, AnEpisodeTrainsItsTurnByTurnTokensNotAReRenderedConversation) {
  if (const std::string reason = tokenizer::testing::SkipReason(); !reason.empty()) {
    GTEST_SKIP() << reason;
  }
  auto codec = tokenizer::HfTextCodec::Load(tokenizer::testing::PackageModelDir("qwen3"));
  ASSERT_TRUE(codec.ok()) << codec.status();
  // A tiny random model over Qwen3's vocabulary.
  ModelConfig c;
  c.arch = Architecture::kQwen2;
  c.hidden_size = 16;
  c.intermediate_size = 32;
  c.num_hidden_layers = 1;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 1;
  c.head_dim = 8;
  c.vocab_size = (*codec)->vocab_size();
  c.max_position_embeddings = 256;
  c.tie_word_embeddings = true;
  c.qkv_bias = true;
  auto weights = std::make_shared<ParameterSet>(*ParameterSet::Allocate(c, Device::Cpu(), false));
  InitializeParameters(*weights, 5, 0.3f);
  EngineOptions o;
  o.batch_invariant = true;
  o.kv_cache_bytes = int64_t{4} << 20;
  auto engine = *Engine::Create(weights, 0, o);

  tokenizer::ChatPrompt chat;
  chat.messages.push_back({{"role", "user"}, {"content", "What is 734*58? Use the calculator."}});
  const std::vector<int32_t> prompt = *(*codec)->EncodeChat(chat);
  SamplingParams p;
  p.temperature = 1.0f;
  p.max_tokens = 6;
  p.seed = 3;
  p.multi_turn = true;
  const uint64_t id = *engine->AddRequest(prompt, p);
  const auto run = [&] {
    for (int i = 0; i < 1000 && engine->Stats().num_running + engine->Stats().num_waiting > 0;
         ++i) {
      ASSERT_TRUE(engine->Step().ok());
    }
  };
  run();
  const std::vector<TurnOutput> first = engine->TakeTurns();
  ASSERT_EQ(first.size(), 1u);
  google::protobuf::RepeatedPtrField<v1::EnvMessage> reply;
  *reply.Add() = Tool("42572");
  const absl::StatusOr<std::vector<int32_t>> delta =
      RenderReply(**codec, reply, first[0].tokens.back());
  ASSERT_TRUE(delta.ok()) << delta.status();
  ASSERT_TRUE(engine->Continue(id, 0, *delta, 6).ok());
  run();
  const std::vector<TurnOutput> second = engine->TakeTurns();
  ASSERT_EQ(second.size(), 1u);
  ASSERT_TRUE(engine->FinishSample(id, 0).ok());
  const SampleOutput s = engine->TakeFinished().at(0).samples.at(0);

  // The record: the sampled tokens and the rendered reply, in order, never re-tokenized.
  std::vector<int32_t> expected = first[0].tokens;
  expected.insert(expected.end(), delta->begin(), delta->end());
  expected.insert(expected.end(), second[0].tokens.begin(), second[0].tokens.end());
  ASSERT_EQ(s.tokens, expected);
  const std::string rendered_reply = *(*codec)->DecodeCompletion(*delta);
  EXPECT_NE(rendered_reply.find("42572"), std::string::npos) << rendered_reply;

  // What re-rendering the finished conversation would train on instead: different tokens.
  tokenizer::ChatPrompt whole = chat;
  whole.add_generation_prompt = false;
  whole.messages.push_back(
      {{"role", "assistant"}, {"content", *(*codec)->DecodeCompletion(first[0].tokens)}});
  whole.messages.push_back({{"role", "tool"}, {"content", "42572"}});
  whole.messages.push_back(
      {{"role", "assistant"}, {"content", *(*codec)->DecodeCompletion(second[0].tokens)}});
  std::vector<int32_t> turn_by_turn = prompt;
  turn_by_turn.insert(turn_by_turn.end(), s.tokens.begin(), s.tokens.end());
  EXPECT_NE(*(*codec)->EncodeChat(whole), turn_by_turn)
      << "re-rendering would have trained on other tokens than the engine sampled";

  // The learner's log-probs of the turn-by-turn tokens are the behaviour log-probs.
  TransformerOptions options;
  options.reduction_order = kernels::ReductionOrder::kBatchInvariant;
  Transformer model(c, Device::Cpu(), options);
  PackedBatch batch;
  batch.AddScored(turn_by_turn, static_cast<int64_t>(prompt.size()));
  std::vector<float> lp(batch.num_tokens());
  ASSERT_TRUE(model.Forward(weights->params, batch, 1.0f, absl::MakeSpan(lp), false).ok());
  int model_tokens = 0;
  for (size_t t = 0; t < s.tokens.size(); ++t) {
    if (s.sources[t] != 0) continue;
    ++model_tokens;
    EXPECT_NEAR(lp[prompt.size() - 1 + t], s.logprobs[t], 1e-5) << "token " << t;
  }
  EXPECT_EQ(model_tokens, static_cast<int>(first[0].tokens.size() + second[0].tokens.size()));
}

}  // namespace
}  // namespace prl::episode
