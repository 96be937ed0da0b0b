// The coordinator suites' fixture: a coordinator over a durable log in a scratch directory,
// with a model text of lowercase letters (LettersCodec) and only the exact_match reward, and
// request builders.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "coordinator/coordinator.h"
#include "core/status_macros.h"
#include "tests/coordinator/coordinator_testing.h"

namespace prl::coordinator {

namespace v1 = prl::v1;

// A model text for the tests: one token per lowercase letter ('a' = 0), stop id 25 ('z'); a
// chat renders as its contents joined by 'x'.
class LettersCodec final : public tokenizer::TextCodec {
 public:
  absl::StatusOr<std::vector<int32_t>> EncodePrompt(absl::string_view text) const override {
    std::vector<int32_t> ids;
    for (char ch : text) {
      if (ch < 'a' || ch > 'z') {
        return absl::InvalidArgumentError(
            absl::StrCat("unknown character '", std::string(1, ch), "'"));
      }
      ids.push_back(ch - 'a');
    }
    return ids;
  }
  absl::StatusOr<std::vector<int32_t>> EncodeContinuation(absl::string_view text) const override {
    return EncodePrompt(text);
  }
  absl::StatusOr<std::string> RenderChat(const tokenizer::ChatPrompt& chat) const override {
    std::string out;
    for (const auto& m : chat.messages) out += m["content"].get<std::string>() + "x";
    return out;
  }
  absl::StatusOr<std::vector<int32_t>> EncodeChat(const tokenizer::ChatPrompt& chat) const override {
    PRL_ASSIGN_OR_RETURN(const std::string text, RenderChat(chat));
    return EncodePrompt(text);
  }
  absl::StatusOr<std::string> DecodeCompletion(absl::Span<const int32_t> ids) const override {
    std::string out;
    for (int32_t id : ids) out.push_back(static_cast<char>('a' + id));
    return out;
  }
  std::vector<int32_t> stop_ids() const override { return {25}; }
  int32_t vocab_size() const override { return 26; }
  std::string Describe() const override { return "letters"; }
};

class CoordinatorTest : public CoordinatorLogTest {
 protected:
  void SetUp() override {
    CoordinatorLogTest::SetUp();
    config_.text = std::make_shared<LettersCodec>();
    config_.validate_reward = [](const v1::RewardSpec& r) {
      return r.name() == "exact_match"
                 ? absl::OkStatus()
                 : absl::InvalidArgumentError(absl::StrCat("unknown reward '", r.name(), "'"));
    };
  }

  static v1::SubmitPromptSetRequest Request(int prompts, int samples = 2) {
    v1::SubmitPromptSetRequest r;
    r.set_name("test");
    for (int i = 0; i < prompts; ++i) {
      v1::Prompt* p = r.add_prompts();
      p->mutable_tokens()->add_ids(1 + i % 40);
      p->mutable_tokens()->add_ids(2);
      p->set_reference(absl::StrCat(i));
    }
    r.set_samples_per_prompt(samples);
    v1::RolloutSampling* s = r.mutable_sampling();
    s->set_temperature(1.0f);
    s->set_top_p(1.0f);
    s->set_max_tokens(8);
    r.mutable_reward()->set_name("exact_match");
    return r;
  }

  static v1::CompleteRequest Done(const std::string& actor, const v1::LeasedPrompt& p,
                                  double reward = 1.0) {
    v1::CompleteRequest c;
    c.set_actor_id(actor);
    c.set_lease_id(p.lease_id());
    c.mutable_result()->set_prompt_index(p.prompt_index());
    for (int i = 0; i < p.samples(); ++i) {
      c.mutable_result()->add_rewards(reward);
      c.mutable_result()->add_completion_tokens(3);
    }
    return c;
  }
};


}  // namespace prl::coordinator
