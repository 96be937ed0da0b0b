#include "runner/episode_evaluation.h"

#include <condition_variable>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "actor/episode_runner.h"
#include "coordinator/prompt_format.h"
#include "core/status_macros.h"
#include "inference_engine/engine.h"

namespace prl::runner {

namespace v1 = prl::v1;

absl::StatusOr<EvalResult> EvaluateEpisodes(std::shared_ptr<const ParameterSet> weights,
                                            const TaskSource& task, int64_t count,
                                            const v1::EnvironmentSpec& environment) {
  const absl::Time start = absl::Now();
  PRL_ASSIGN_OR_RETURN(const std::vector<v1::Prompt> prompts, task.EvalPrompts(count));
  EngineOptions options;
  options.kv_cache_bytes = int64_t{64} << 20;
  const int64_t vocab = weights->config.vocab_size;
  PRL_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::Create(weights, 0, options));
  // The task outlives the runner: a shared_ptr that owns nothing.
  std::shared_ptr<const tokenizer::TextCodec> codec(std::shared_ptr<void>(), &task.text());
  std::mutex mu;
  std::condition_variable woken;
  bool wake = false;
  actor::EpisodeRunner episodes(codec, /*threads=*/2, [&] {
    std::lock_guard<std::mutex> lock(mu);
    wake = true;
    woken.notify_one();
  });
  std::map<std::string, size_t> prompt_of;  // by lease id
  for (size_t i = 0; i < prompts.size(); ++i) {
    v1::LeasedPrompt lease;
    lease.set_lease_id(absl::StrCat("eval-", i));
    PRL_ASSIGN_OR_RETURN(const std::vector<int32_t> ids,
                         coordinator::PromptTokens(prompts[i], &task.text(), vocab,
                                                   absl::StrCat("held-out prompt ", i)));
    lease.mutable_prompt_tokens()->Assign(ids.begin(), ids.end());
    lease.set_reference(prompts[i].reference());
    lease.set_samples(1);
    lease.mutable_sampling()->set_temperature(0);
    lease.mutable_sampling()->set_max_tokens(environment.max_tokens_per_turn());
    for (int32_t id : task.text().stop_ids()) lease.mutable_sampling()->add_stop_token_ids(id);
    *lease.mutable_environment() = environment;
    prompt_of[lease.lease_id()] = i;
    episodes.StartGroup(lease, engine->max_sequence_tokens());
  }
  std::map<uint64_t, size_t> by_request;
  std::vector<actor::EpisodeOutcome> outcomes(prompts.size());
  size_t finished = 0;
  while (finished < prompts.size()) {
    using Kind = actor::EpisodeRunner::Action::Kind;
    std::vector<actor::EpisodeRunner::Action> actions = episodes.TakeActions();
    const EngineStats before = engine->Stats();
    if (actions.empty() && before.num_running == 0 && before.num_waiting == 0 &&
        !episodes.Busy()) {  // (every ended turn went to the runner right after its Step)
      // Nothing runs, nothing is being answered, nothing waits to be applied (Busy counts the
      // pool's jobs and the actions under one lock): an episode was lost, never to finish.
      return absl::InternalError(absl::StrCat(
          "held-out episodes: ", prompts.size() - finished,
          " unfinished with nothing running or waiting for their environment"));
    }
    for (actor::EpisodeRunner::Action& a : actions) {
      SamplingParams greedy;
      greedy.n = 1;
      greedy.temperature = 0;
      greedy.stop_token_ids = task.text().stop_ids();
      absl::StatusOr<uint64_t> applied =
          actor::EpisodeRunner::Apply(*engine, a, std::move(greedy));
      if (!applied.ok()) {
        return absl::Status(applied.status().code(),
                            absl::StrCat("held-out episode ", a.lease_id, ": ",
                                         applied.status().message()));
      }
      if (a.kind == Kind::kAddGroup) {
        by_request[*applied] = prompt_of.at(a.lease_id);
        episodes.Bind(a.lease_id, *applied);
      }
    }
    const EngineStats stats = engine->Stats();
    if (stats.num_running > 0 || stats.num_waiting > 0) {
      PRL_RETURN_IF_ERROR(engine->Step());
      for (const TurnOutput& turn : engine->TakeTurns()) episodes.OnTurn(turn);
    } else {  // every episode waits for its environment
      std::unique_lock<std::mutex> lock(mu);
      woken.wait_for(lock, std::chrono::milliseconds(20), [&] { return wake; });
      wake = false;
    }
    for (const RequestOutput& out : engine->TakeFinished()) {
      std::vector<actor::EpisodeOutcome> outcome = episodes.TakeOutcome(out.request_id);
      if (outcome.size() != 1) {
        return absl::InternalError(
            absl::StrCat("held-out request ", out.request_id, " finished without its episode"));
      }
      outcomes[by_request.at(out.request_id)] = std::move(outcome.front());
      ++finished;
    }
  }
  EvalResult result;
  result.problems = static_cast<int64_t>(prompts.size());
  double reward = 0, multi = 0, turns = 0;
  for (const actor::EpisodeOutcome& o : outcomes) {
    reward += o.reward;
    multi += o.turn_ends.size() >= 2 ? 1 : 0;
    turns += static_cast<double>(o.turn_ends.size());
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
