#include "runner/episode_evaluation.h"

#include <condition_variable>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "coordinator/prompt_format.h"
#include "core/status_macros.h"
#include "episode/episode_engine.h"
#include "inference_engine/engine.h"

namespace prl::runner {

namespace v1 = prl::v1;

absl::StatusOr<EvalResult> EvaluateEpisodes(std::shared_ptr<const ParameterSet> weights,
                                            const TaskSource& task, int64_t count,
                                            const v1::EnvironmentSpec& environment,
                                            const v1::AgentSpec& agent) {
  const bool by_agent = !agent.address().empty();
  const absl::Time start = absl::Now();
  PRL_ASSIGN_OR_RETURN(const std::vector<v1::Prompt> prompts, task.EvalPrompts(count));
  EngineOptions options;
  options.kv_cache_bytes = int64_t{64} << 20;
  const int64_t vocab = weights->config.vocab_size;
  PRL_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::Create(weights, 0, options));
  // The task outlives the episode engine: a shared_ptr that owns nothing.
  std::shared_ptr<const tokenizer::TextCodec> codec(std::shared_ptr<void>(), &task.text());
  std::mutex mu;
  std::condition_variable woken;
  bool wake = false;
  episode::EpisodeEngine episodes(std::move(engine), codec, {}, [&] {
    std::lock_guard<std::mutex> lock(mu);
    wake = true;
    woken.notify_one();
  });
  if (by_agent) {  // loopback, like an actor's by default
    PRL_RETURN_IF_ERROR(episodes.ServeAgents({}, "prl-eval"));
  }
  for (size_t i = 0; i < prompts.size(); ++i) {
    episode::GroupRequest g;
    g.id = absl::StrCat("eval-", i);
    PRL_ASSIGN_OR_RETURN(g.prompt, coordinator::PromptTokens(prompts[i], &task.text(), vocab,
                                                             absl::StrCat("held-out prompt ", i)));
    g.params.n = 1;
    g.params.temperature = 0;
    g.params.max_tokens = environment.max_tokens_per_turn();
    g.params.stop_token_ids = task.text().stop_ids();
    if (by_agent) {
      g.agent = agent;
      g.params.max_tokens = agent.max_tokens_per_call();
    } else {
      g.environment = environment;
    }
    g.reference = prompts[i].reference();
    g.submitted = coordinator::EpisodePromptOf(prompts[i]);
    PRL_RETURN_IF_ERROR(episodes.Add(std::move(g)));
  }
  std::vector<episode::EpisodeOutcome> outcomes(prompts.size());
  size_t finished = 0;
  while (finished < prompts.size()) {
    const bool runnable = episodes.Runnable();
    PRL_RETURN_IF_ERROR(episodes.Step());
    for (const episode::FailedGroup& f : episodes.TakeFailed()) {
      return absl::Status(f.why.code(),
                          absl::StrCat("held-out episode ", f.id, ": ", f.why.message()));
    }
    for (episode::FinishedGroup& done : episodes.TakeFinished()) {
      size_t index = 0;
      if (done.episodes.size() != 1 || !absl::SimpleAtoi(done.id.substr(5), &index) ||
          index >= outcomes.size()) {
        return absl::InternalError(
            absl::StrCat("held-out group ", done.id, " finished without its one episode"));
      }
      outcomes[index] = std::move(done.episodes.front());
      ++finished;
    }
    if (finished < prompts.size() && episodes.empty()) {
      return absl::InternalError(absl::StrCat("held-out episodes: ", prompts.size() - finished,
                                              " unfinished with none running or waiting"));
    }
    if (!runnable) {  // every episode waits for its environment
      std::unique_lock<std::mutex> lock(mu);
      woken.wait_for(lock, std::chrono::milliseconds(20), [&] { return wake; });
      wake = false;
    }
  }
  EvalResult result;
  result.problems = static_cast<int64_t>(prompts.size());
  double reward = 0, multi = 0, turns = 0;
  for (const episode::EpisodeOutcome& o : outcomes) {
    reward += o.reward;
    size_t n = o.turn_ends.size();
    if (!o.segments.empty()) {  // an agent's: its calls, in all its records
      n = 0;
      for (const episode::EpisodeSegment& s : o.segments) n += s.turn_ends.size();
    }
    multi += n >= 2 ? 1 : 0;
    turns += static_cast<double>(n);
  }
  if (result.problems > 0) {
    const double n = static_cast<double>(result.problems);
    result.accuracy = reward / n;
    result.multi_turn_rate = multi / n;
    result.turns_mean = turns / n;
  }
  result.seconds = absl::ToDoubleSeconds(absl::Now() - start);
  return result;
}

}  // namespace prl::runner
