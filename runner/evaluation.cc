#include "runner/evaluation.h"

#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "coordinator/prompt_format.h"
#include "core/status_macros.h"
#include "inference_engine/engine.h"
#include "runner/episode_evaluation.h"

namespace prl::runner {

absl::StatusOr<EvalResult> Evaluate(std::shared_ptr<const ParameterSet> weights,
                                    const TaskSource& task, int64_t count, int32_t max_tokens,
                                    const prl::v1::EnvironmentSpec& environment,
                                    const prl::v1::AgentSpec& agent) {
  if (!environment.name().empty() || !agent.address().empty()) {
    return EvaluateEpisodes(std::move(weights), task, count, environment, agent);
  }
  const absl::Time start = absl::Now();
  PRL_ASSIGN_OR_RETURN(const std::vector<prl::v1::Prompt> prompts, task.EvalPrompts(count));
  PRL_ASSIGN_OR_RETURN(std::unique_ptr<reward::RewardFunction> reward,
                       reward::MakeRewardFunction(task.EvalReward()));
  EngineOptions options;
  options.kv_cache_bytes = int64_t{64} << 20;
  const int64_t vocab = weights->config.vocab_size;
  PRL_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::Create(weights, 0, options));
  SamplingParams params;
  params.n = 1;
  params.temperature = 0;
  params.max_tokens = max_tokens;
  params.stop_token_ids = task.text().stop_ids();
  std::map<uint64_t, size_t> prompt_of;
  for (size_t i = 0; i < prompts.size(); ++i) {
    PRL_ASSIGN_OR_RETURN(std::vector<int32_t> ids,
                         coordinator::PromptTokens(prompts[i], &task.text(), vocab,
                                                   absl::StrCat("held-out prompt ", i)));
    PRL_ASSIGN_OR_RETURN(const uint64_t id, engine->AddRequest(std::move(ids), params));
    prompt_of[id] = i;
  }
  std::vector<reward::RewardInput> inputs(prompts.size());
  while (engine->HasUnfinishedRequests()) {
    PRL_RETURN_IF_ERROR(engine->Step());
    for (const RequestOutput& out : engine->TakeFinished()) {
      const SampleOutput& s = out.samples.at(0);
      std::vector<int32_t> visible = s.tokens;  // the text a verifier sees ends before the stop
      if (s.finish_reason == FinishReason::kStop && !visible.empty()) visible.pop_back();
      reward::RewardInput& in = inputs[prompt_of.at(out.request_id)];
      PRL_ASSIGN_OR_RETURN(in.completion, task.text().DecodeCompletion(visible));
      in.reference = prompts[prompt_of.at(out.request_id)].reference();
      in.completion_tokens = s.tokens;
    }
  }
  PRL_ASSIGN_OR_RETURN(const std::vector<reward::RewardResult> rewards, reward->ScoreBatch(inputs));
  double total = 0;
  for (const reward::RewardResult& r : rewards) total += r.reward;
  EvalResult result;
  result.problems = static_cast<int64_t>(prompts.size());
  result.accuracy = result.problems > 0 ? total / static_cast<double>(result.problems) : 0;
  result.seconds = absl::ToDoubleSeconds(absl::Now() - start);
  return result;
}

}  // namespace prl::runner
