#include "runner/evaluation.h"

#include <map>
#include <string>
#include <vector>

#include "core/status_macros.h"
#include "inference_engine/engine.h"
#include "task/char_tokenizer.h"

namespace prl::runner {

absl::StatusOr<EvalResult> EvaluateArithmetic(std::shared_ptr<const ParameterSet> weights,
                                              const task::ArithmeticConfig& task,
                                              int64_t num_problems, uint64_t seed,
                                              int32_t max_tokens) {
  const absl::Time start = absl::Now();
  PRL_ASSIGN_OR_RETURN(const std::vector<task::ArithmeticProblem> problems,
                       task::GenerateProblems(task, task::Split::kHeldOut, seed, num_problems));
  const task::CharTokenizer tokenizer;
  EngineOptions options;
  options.kv_cache_bytes = int64_t{32} << 20;
  PRL_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::Create(weights, 0, options));
  SamplingParams params;
  params.n = 1;
  params.temperature = 0;
  params.max_tokens = max_tokens;
  params.stop_token_ids = {tokenizer.eos_id()};
  std::map<uint64_t, size_t> problem_of;
  for (size_t i = 0; i < problems.size(); ++i) {
    PRL_ASSIGN_OR_RETURN(std::vector<int32_t> prompt, task::PromptTokens(tokenizer, problems[i]));
    PRL_ASSIGN_OR_RETURN(const uint64_t id, engine->AddRequest(std::move(prompt), params));
    problem_of[id] = i;
  }
  double correct = 0;
  while (engine->HasUnfinishedRequests()) {
    PRL_RETURN_IF_ERROR(engine->Step());
    for (const RequestOutput& out : engine->TakeFinished()) {
      PRL_ASSIGN_OR_RETURN(const std::string text, tokenizer.Decode(out.samples.at(0).tokens));
      correct += task::ArithmeticReward(text, problems[problem_of.at(out.request_id)].answer);
    }
  }
  EvalResult result;
  result.problems = static_cast<int64_t>(problems.size());
  result.accuracy = result.problems > 0 ? correct / static_cast<double>(result.problems) : 0;
  result.seconds = absl::ToDoubleSeconds(absl::Now() - start);
  return result;
}

}  // namespace prl::runner
