#include "runner/task_source.h"

#include <algorithm>
#include <filesystem>
#include <random>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "coordinator/prompt_format.h"
#include "core/status_macros.h"
#include "env/calculator.h"
#include "env/guess_number.h"
#include "roles/model_text.h"
#include "roles/reward_role.h"
#include "task/arithmetic_task.h"
#include "task/char_text_codec.h"

namespace prl::runner {

namespace {

namespace v1 = prl::v1;

task::ArithmeticConfig ArithmeticConfigOf(const config::RunConfig& c) {
  task::ArithmeticConfig t;
  t.min_digits = c.task.min_digits;
  t.max_digits = c.task.max_digits;
  t.operations = c.task.operations;
  return t;
}

// Evaluation scores what training does, except that the arithmetic reward's is exact.
reward::RewardSpec EvalRewardOf(reward::RewardSpec spec) {
  if (spec.name == "arithmetic") spec.params["credit"] = "exact";
  return spec;
}

class ArithmeticSource final : public TaskSource {
 public:
  explicit ArithmeticSource(const config::RunConfig& c) : c_(c) {}

  absl::StatusOr<std::vector<v1::Prompt>> SftPrompts(int64_t count) const override {
    return Prompts(task::Split::kTrain, c_.run.seed * 7919 + 1, count);
  }
  absl::StatusOr<std::vector<v1::Prompt>> TrainPrompts(int64_t chunk,
                                                       int64_t count) const override {
    return Prompts(task::Split::kTrain, c_.run.seed * 104729 + 17 + chunk, count);
  }
  absl::StatusOr<std::vector<v1::Prompt>> EvalPrompts(int64_t count) const override {
    return Prompts(task::Split::kHeldOut, c_.run.seed, count);
  }
  const tokenizer::TextCodec& text() const override { return text_; }
  reward::RewardSpec TrainReward() const override { return roles::TaskRewardSpec(c_); }
  // Held-out accuracy is always the exact arithmetic reward.
  reward::RewardSpec EvalReward() const override { return {"arithmetic", {{"credit", "exact"}}}; }

 private:
  absl::StatusOr<std::vector<v1::Prompt>> Prompts(task::Split split, uint64_t seed,
                                                  int64_t count) const {
    PRL_ASSIGN_OR_RETURN(const std::vector<task::ArithmeticProblem> problems,
                         task::GenerateProblems(ArithmeticConfigOf(c_), split, seed, count));
    const task::CharTokenizer tokenizer;
    std::vector<v1::Prompt> prompts;
    for (const task::ArithmeticProblem& p : problems) {
      PRL_ASSIGN_OR_RETURN(const std::vector<int32_t> ids, task::PromptTokens(tokenizer, p));
      v1::Prompt& prompt = prompts.emplace_back();
      prompt.mutable_tokens()->mutable_ids()->Assign(ids.begin(), ids.end());
      prompt.set_reference(p.answer);
    }
    return prompts;
  }

  const config::RunConfig& c_;
  task::CharTextCodec text_;
};

// The guessing game's secrets (env/guess_number.h) in [low, high] of env.params (1 to 100 by
// default; validated with the config), as prompts "#" in the character tokenizer: train and
// warm-start secrets drawn uniformly per seed; the held-out ones every secret of the range (so
// the accuracy is the share of the range found), or eval_prompts of them spread evenly.
class GuessNumberSource final : public TaskSource {
 public:
  explicit GuessNumberSource(const config::RunConfig& c) : c_(c) {
    low_ = env::IntParameter(c.env.params, "low", env::kDefaultLow, "env.params")
               .value_or(env::kDefaultLow);
    high_ = std::max(low_, env::IntParameter(c.env.params, "high", env::kDefaultHigh, "env.params")
                               .value_or(env::kDefaultHigh));
  }

  absl::StatusOr<std::vector<v1::Prompt>> SftPrompts(int64_t count) const override {
    return Drawn(c_.run.seed * 7919 + 1, count);
  }
  absl::StatusOr<std::vector<v1::Prompt>> TrainPrompts(int64_t chunk,
                                                       int64_t count) const override {
    return Drawn(c_.run.seed * 104729 + 17 + chunk, count);
  }
  absl::StatusOr<std::vector<v1::Prompt>> EvalPrompts(int64_t count) const override {
    // Every secret once, or `count` of them spread evenly over the range.
    const int64_t size = high_ - low_ + 1, n = std::min(count, size);
    std::vector<v1::Prompt> out;
    for (int64_t i = 0; i < n; ++i) out.push_back(Secret(low_ + i * size / n));
    return out;
  }
  const tokenizer::TextCodec& text() const override { return text_; }
  // Unused: the environment scores the episodes.
  reward::RewardSpec TrainReward() const override { return {"exact_match", {}}; }
  reward::RewardSpec EvalReward() const override { return {"exact_match", {}}; }

 private:
  v1::Prompt Secret(int64_t secret) const {
    v1::Prompt p;
    const task::CharTokenizer tokenizer;
    p.mutable_tokens()->add_ids(tokenizer.bos_id());
    p.mutable_tokens()->add_ids(tokenizer.Encode("#")->front());
    p.set_reference(absl::StrCat(secret));
    return p;
  }
  std::vector<v1::Prompt> Drawn(uint64_t seed, int64_t count) const {
    std::mt19937_64 rng(seed);
    std::uniform_int_distribution<int64_t> secret(low_, high_);
    std::vector<v1::Prompt> out;
    for (int64_t i = 0; i < count; ++i) out.push_back(Secret(secret(rng)));
    return out;
  }

  const config::RunConfig& c_;
  int64_t low_ = env::kDefaultLow, high_ = env::kDefaultHigh;
  task::CharTextCodec text_;
};

class PromptFileSource final : public TaskSource {
 public:
  PromptFileSource(const config::RunConfig& c, std::shared_ptr<const tokenizer::TextCodec> text,
                   std::vector<v1::Prompt> train, std::vector<v1::Prompt> eval)
      : c_(c), text_(std::move(text)), train_(std::move(train)), eval_(std::move(eval)) {}

  absl::StatusOr<std::vector<v1::Prompt>> SftPrompts(int64_t count) const override {
    return Wrapped(0, count);
  }
  absl::StatusOr<std::vector<v1::Prompt>> TrainPrompts(int64_t chunk,
                                                       int64_t count) const override {
    return Wrapped(chunk * count, count);
  }
  absl::StatusOr<std::vector<v1::Prompt>> EvalPrompts(int64_t count) const override {
    return std::vector<v1::Prompt>(
        eval_.begin(),
        eval_.begin() + std::min<int64_t>(count, static_cast<int64_t>(eval_.size())));
  }
  const tokenizer::TextCodec& text() const override { return *text_; }
  reward::RewardSpec TrainReward() const override { return roles::TaskRewardSpec(c_); }
  reward::RewardSpec EvalReward() const override { return EvalRewardOf(roles::TaskRewardSpec(c_)); }

 private:
  std::vector<v1::Prompt> Wrapped(int64_t first, int64_t count) const {
    std::vector<v1::Prompt> out;
    const int64_t n = static_cast<int64_t>(train_.size());
    for (int64_t i = 0; i < count; ++i) out.push_back(train_[(first + i) % n]);
    return out;
  }

  const config::RunConfig& c_;
  std::shared_ptr<const tokenizer::TextCodec> text_;
  std::vector<v1::Prompt> train_, eval_;
};

absl::StatusOr<std::vector<v1::Prompt>> ReadTaskFile(const std::string& path, const char* key) {
  if (path.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(key, ": task.name = prompts needs a JSONL file of prompts with references"));
  }
  PRL_ASSIGN_OR_RETURN(std::vector<v1::Prompt> prompts, coordinator::ReadPromptFile(path));
  if (prompts.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(key, ": ", path, " has no prompts"));
  }
  return prompts;
}

}  // namespace

absl::StatusOr<std::unique_ptr<TaskSource>> OpenTask(const config::RunConfig& c,
                                                     const std::string& model_dir,
                                                     int64_t model_vocab_size) {
  if (c.task.name == config::TaskName::kArithmetic) {
    return std::unique_ptr<TaskSource>(new ArithmeticSource(c));
  }
  if (c.task.name == config::TaskName::kGuessNumber) {
    return std::unique_ptr<TaskSource>(new GuessNumberSource(c));
  }
  PRL_ASSIGN_OR_RETURN(std::vector<v1::Prompt> train,
                       ReadTaskFile(c.task.train_file, "task.train_file"));
  PRL_ASSIGN_OR_RETURN(std::vector<v1::Prompt> eval,
                       ReadTaskFile(c.task.eval_file, "task.eval_file"));
  absl::StatusOr<std::shared_ptr<const tokenizer::TextCodec>> text =
      roles::OpenModelText(c, model_dir, model_vocab_size);
  if (!text.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("task.name = prompts: ", text.status().message()));
  }
  return std::unique_ptr<TaskSource>(
      new PromptFileSource(c, std::move(*text), std::move(train), std::move(eval)));
}

v1::EnvironmentSpec EnvironmentOf(const config::RunConfig& c) {
  v1::EnvironmentSpec e;
  if (c.env.name.empty()) return e;
  e.set_name(c.env.name);
  e.set_address(c.env.address);
  for (const auto& [k, v] : c.env.params) (*e.mutable_parameters())[k] = v;
  e.set_max_turns(c.env.max_turns);
  e.set_max_tokens_per_turn(c.env.max_tokens_per_turn);
  e.set_max_episode_tokens(c.env.max_episode_tokens);
  e.set_timeout_s(c.env.timeout_s);
  e.set_tool_call_format(c.env.tool_call_format);
  coordinator::FillEnvironmentDefaults(c.task.max_tokens, c.coordinator.max_env_timeout_s, &e);
  return e;
}

v1::AgentSpec AgentOf(const config::RunConfig& c) {
  v1::AgentSpec a;
  if (c.agent.address.empty()) return a;
  a.set_name(c.agent.name);
  a.set_address(c.agent.address);
  for (const auto& [k, v] : c.agent.params) (*a.mutable_parameters())[k] = v;
  a.set_max_calls(c.agent.max_calls);
  a.set_max_tokens_per_call(c.agent.max_tokens_per_call);
  a.set_max_episode_tokens(c.agent.max_episode_tokens);
  a.set_timeout_s(c.agent.timeout_s);
  a.set_tool_call_format(c.agent.tool_call_format);
  coordinator::FillAgentDefaults(c.task.max_tokens, c.coordinator.max_agent_timeout_s, &a);
  return a;
}

absl::Status CheckEnvironmentText(const config::RunConfig& c, const tokenizer::TextCodec& text) {
  if (c.env.name.empty() || !c.env.address.empty()) return absl::OkStatus();
  std::vector<std::pair<std::string, std::string>> words;  // (key, default)
  if (c.env.name == "calculator") {
    words = {{"call_open", env::kDefaultCallOpen}, {"call_close", env::kDefaultCallClose}};
  } else {
    const auto bound = [&](const char* key, int64_t fallback) {
      return env::IntParameter(c.env.params, key, fallback, "env.params").value_or(fallback);
    };
    words = {{"higher_text", env::kDefaultHigherText},
             {"lower_text", env::kDefaultLowerText},
             {"rules_text", env::DefaultRulesText(bound("low", env::kDefaultLow),
                                                  bound("high", env::kDefaultHigh))}};
  }
  for (const auto& [key, fallback] : words) {
    auto it = c.env.params.find(key);
    const bool given = it != c.env.params.end();
    const std::string& value = given ? it->second : fallback;
    if (!text.EncodeContinuation(value).ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("env.params.", key, ": '", value.substr(0, 64), "'",
                       given ? "" : " (the default)", " cannot be written in ", text.Describe(),
                       ": give the environment words the model can read (examples/*_run.json)"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<SftExample>> SftExamples(const TaskSource& task,
                                                    absl::Span<const v1::Prompt> prompts,
                                                    int64_t vocab_size) {
  const std::vector<int32_t> stop = task.text().stop_ids();
  if (stop.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        task.text().Describe(), " has no stop token: a warm-start example needs one to end on"));
  }
  std::vector<SftExample> examples;
  for (size_t i = 0; i < prompts.size(); ++i) {
    SftExample& e = examples.emplace_back();
    PRL_ASSIGN_OR_RETURN(e.prompt, coordinator::PromptTokens(prompts[i], &task.text(), vocab_size,
                                                             absl::StrCat("prompt ", i)));
    PRL_ASSIGN_OR_RETURN(e.completion, task.text().EncodeContinuation(prompts[i].reference()));
    e.completion.push_back(stop.front());
  }
  return examples;
}

}  // namespace prl::runner

namespace prl::runner {

void SetScoring(const config::RunConfig& config, const reward::RewardSpec& reward,
                prl::v1::SubmitPromptSetRequest* request) {
  const prl::v1::AgentSpec agent = AgentOf(config);
  const prl::v1::EnvironmentSpec environment = EnvironmentOf(config);
  if (!agent.address().empty()) {
    *request->mutable_agent() = agent;  // an agent's episode reward is the agent's
  } else if (!environment.name().empty()) {
    *request->mutable_environment() = environment;  // an episode's reward is its environment's
  } else {
    request->mutable_reward()->set_name(reward.name);
    for (const auto& [k, v] : reward.params) (*request->mutable_reward()->mutable_params())[k] = v;
  }
}

}  // namespace prl::runner
