// episode/turn_renderer.h with Qwen3's real chat template and tokenizer (from the npm references;
// skipped without them): a chat prompt's first observation is rendered as
// apply_chat_template(messages + observation, add_generation_prompt=True) renders it — checked
// against @huggingface/jinja and transformers.js, never an empty assistant turn before the
// observation; the prompt's template variables (enable_thinking) render every reply; a reply
// that quotes the stand-in marker is still rendered whole.
#include "episode/turn_renderer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <sstream>

#include "tests/episode/qwen3_reference.h"
#include "tests/tokenizer/js_reference.h"
#include "tokenizer/hf_text_codec.h"

namespace prl::episode {
namespace {

using Json = nlohmann::ordered_json;

class TurnRendererTest : public testing::Qwen3Test {};

v1::Chat Question() {
  v1::Chat chat;
  v1::ChatMessage* system = chat.add_messages();
  system->set_role("system");
  system->set_content("You play a guessing game.");
  v1::ChatMessage* user = chat.add_messages();
  user->set_role("user");
  user->set_content("Guess my number between 1 and 100 — ready?");
  return chat;
}

EnvMessages Observation() {
  EnvMessages messages;
  v1::EnvMessage* m = messages.Add();
  m->set_role("user");
  m->set_content("Rules: answer with one number.\nYou have 7 guesses. 🎯");
  return messages;
}

TEST_F(TurnRendererTest, AChatPromptsFirstObservationFollowsItsMessagesAsTheTemplateRendersThem) {
  const v1::Chat chat = Question();
  absl::StatusOr<std::vector<int32_t>> first =
      RenderFirstPrompt(*codec_, chat, Observation(), ChatContext{});
  ASSERT_TRUE(first.ok()) << first.status();
  const Json context = {
      {"messages", Json::array({{{"role", "system"}, {"content", chat.messages(0).content()}},
                                {{"role", "user"}, {"content", chat.messages(1).content()}},
                                {{"role", "user"}, {"content", Observation()[0].content()}}})},
      {"add_generation_prompt", true}};
  EXPECT_EQ(*first, ReferenceIds(context));
  const std::string text = *codec_->DecodeCompletion(*first);  // (special tokens dropped)
  EXPECT_EQ(text.find("assistant\n\nuser"), std::string::npos) << "an empty assistant turn";
  EXPECT_NE(text.find("ready?\nuser\nRules"), std::string::npos) << text;
  // FirstPromptOf: the same for a chat prompt with an observation.
  v1::EpisodePrompt submitted;
  *submitted.mutable_chat() = chat;
  absl::StatusOr<std::vector<int32_t>> via =
      FirstPromptOf(*codec_, {1, 2, 3}, submitted, Observation(), ChatContext{});
  ASSERT_TRUE(via.ok()) << via.status();
  EXPECT_EQ(*via, *first);
}

TEST_F(TurnRendererTest, APromptsTemplateVariablesRenderEveryReply) {
  v1::EpisodePrompt submitted;
  *submitted.mutable_chat() = Question();
  submitted.mutable_chat()->set_template_kwargs_json(R"({"enable_thinking": false})");
  absl::StatusOr<ChatContext> context = ChatContextOf(submitted);
  ASSERT_TRUE(context.ok()) << context.status();
  const std::vector<int32_t> with = *RenderReply(*codec_, Observation(), -1, *context);
  const std::vector<int32_t> without = *RenderReply(*codec_, Observation(), -1);
  // Qwen3 opens a non-thinking turn with an empty think block; without the variable it does not.
  const std::vector<int32_t> think = *codec_->EncodeContinuation("<think>\n\n</think>\n\n");
  ASSERT_EQ(with.size(), without.size() + think.size());
  EXPECT_TRUE(std::equal(without.begin(), without.end(), with.begin()));
  EXPECT_TRUE(std::equal(think.begin(), think.end(), with.end() - think.size()));
}

TEST_F(TurnRendererTest, AReplyQuotingTheStandInMarkerIsRenderedWhole) {
  EnvMessages reply;
  v1::EnvMessage* m = reply.Add();
  m->set_role("tool");
  m->set_content("output: PRL-STAND-IN-7f3a and PRL-STAND-IN-7f3a-0 end");
  absl::StatusOr<std::vector<int32_t>> tokens = RenderReply(*codec_, reply, -1);
  ASSERT_TRUE(tokens.ok()) << tokens.status();
  const std::string text = *codec_->DecodeCompletion(*tokens);
  EXPECT_NE(text.find("output: PRL-STAND-IN-7f3a and PRL-STAND-IN-7f3a-0 end"), std::string::npos)
      << text;
}

}  // namespace
}  // namespace prl::episode
