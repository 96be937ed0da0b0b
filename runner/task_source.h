// The run's task for `prl run` (task.name): the prompts of the warm-start, of RL and of the
// held-out evaluation, the model text they go through, and the rewards that score them.
//
//   arithmetic  the built-in task (task/arithmetic_task.h): problems drawn from a seeded split,
//               token prompts in the character tokenizer, the arithmetic reward (task.credit
//               for training, exact for evaluation); with env.name = calculator, episodes.
//   guess_number  the built-in guessing game's secrets (env.name = guess_number).
//   prompts     task.train_file and task.eval_file, JSONL prompt lines with a "reference"
//               (coordinator/prompt_format.h), through the model's own tokenizer and chat
//               template, scored by task.reward with task.reward_params.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "config/run_config.h"
#include "prl/v1/prompt.pb.h"
#include "reward/verifiers.h"
#include "tokenizer/text_codec.h"

namespace prl::runner {

// A supervised example: the learner trains on the completion (the reference and a stop token).
struct SftExample {
  std::vector<int32_t> prompt, completion;
  // An episode's demonstration: per completion token, 0 the model's (trained), 1 the
  // environment's (context only). Empty: every token is the model's.
  std::vector<uint8_t> sources;
};

class TaskSource {
 public:
  virtual ~TaskSource() = default;
  // `count` warm-start prompts (each with its reference).
  virtual absl::StatusOr<std::vector<prl::v1::Prompt>> SftPrompts(int64_t count) const = 0;
  // RL's chunk number `chunk` of `count` train prompts (files wrap around).
  virtual absl::StatusOr<std::vector<prl::v1::Prompt>> TrainPrompts(int64_t chunk,
                                                                    int64_t count) const = 0;
  // At most `count` held-out prompts, always the same ones.
  virtual absl::StatusOr<std::vector<prl::v1::Prompt>> EvalPrompts(int64_t count) const = 0;
  virtual const tokenizer::TextCodec& text() const = 0;
  virtual reward::RewardSpec TrainReward() const = 0;
  virtual reward::RewardSpec EvalReward() const = 0;
};

// `model_dir`: the model the run starts from (its tokenizer for the prompts task). Errors name
// the keys (a prompts task without task.train_file, a model without tokenizer files).
absl::StatusOr<std::unique_ptr<TaskSource>> OpenTask(const config::RunConfig& config,
                                                     const std::string& model_dir,
                                                     int64_t model_vocab_size);

// The run's environment (env.*) as prompt sets name it, with the defaults filled in as the
// coordinator fills them; an empty name: the task has no episodes.
prl::v1::EnvironmentSpec EnvironmentOf(const config::RunConfig& config);

// The run's agent (agent.*) as prompt sets name it, defaults filled in as the coordinator fills
// them; an empty address: none. With an agent, the run's episodes are the agent's (a built-in
// env.name beside it only demonstrates the warm-start).
prl::v1::AgentSpec AgentOf(const config::RunConfig& config);

// How the run's prompt sets are scored: by the run's agent (its episode reward), else its
// environment (the episode's reward), else `reward`.
void SetScoring(const config::RunConfig& config, const reward::RewardSpec& reward,
                prl::v1::SubmitPromptSetRequest* request);

// With a built-in environment: the words it writes and reads (the calculator's call syntax,
// the game's feedback), given or its defaults, can be written in the task's text; else an
// error naming the env.params key (the character tokenizer has no letters).
absl::Status CheckEnvironmentText(const config::RunConfig& config,
                                  const tokenizer::TextCodec& text);

// The warm-start's examples of `prompts`: the prompt's tokens, and the reference's followed by
// the first stop id.
absl::StatusOr<std::vector<SftExample>> SftExamples(const TaskSource& task,
                                                    absl::Span<const prl::v1::Prompt> prompts,
                                                    int64_t vocab_size);

}  // namespace prl::runner
