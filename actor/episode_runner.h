// EpisodeRunner: the agentic episodes of an actor (docs/environments.md). One episode is one
// sample of a group, run against the prompt set's environment: started before the group goes
// into the engine, then, every time a sample's model turn ends (the engine pauses it with its
// KV cache), the turn goes to the environment and the sample goes on with the reply rendered
// as a delta (actor/turn_renderer.h), or ends: the environment said done, or a limit was
// reached (env max_turns, max_episode_tokens, the model's context: then EndEpisode scores the
// truncated episode).
//
// Environment calls never run on the engine's thread: a small pool makes them and leaves
// actions (continue a sample, finish it, abort the group) for the engine loop to apply between
// steps, so the engine serves other sequences while an episode waits. Any failure of an
// episode (its environment down after the retries, a malformed answer, a reply the template
// cannot render) aborts the whole group: it is released (a failed attempt, visible) and never
// trained with a made-up reward.
//
// Owns: each group's episodes (turns, tokens, rewards), the pool, the pending actions.
// Thread-safety: the engine loop calls everything; the pool's threads run the calls.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "actor/environments.h"
#include "actor/episode_outcome.h"
#include "inference_engine/engine.h"
#include "metrics/prl_metrics.h"
#include "prl/v1/prompt.pb.h"
#include "tokenizer/text_codec.h"

namespace prl::actor {

class EpisodeRunner {
 public:
  // What the engine loop does next.
  struct Action {
    enum class Kind { kAddGroup, kContinue, kFinish, kAbort } kind = Kind::kAddGroup;
    std::string lease_id;
    uint64_t request_id = 0;  // kContinue, kFinish, kAbort (0: not in the engine yet)
    int32_t sample = 0;
    std::vector<int32_t> tokens;  // kAddGroup: the prompt (with the first observation);
                                  // kContinue: the reply
    SamplingParams params;        // kAddGroup
    int32_t max_tokens = 0;       // kContinue
    absl::Status failure;         // kAbort

    static Action Of(Kind kind, std::string lease_id, uint64_t request_id = 0,
                     int32_t sample = 0) {
      Action a;
      a.kind = kind;
      a.lease_id = std::move(lease_id);
      a.request_id = request_id;
      a.sample = sample;
      return a;
    }
  };

  // `codec` renders and decodes text (episodes need one); `wake` is called when actions wait,
  // sometimes with the runner's lock held: it must not call back into the runner.
  EpisodeRunner(std::shared_ptr<const tokenizer::TextCodec> codec, int threads,
                std::function<void()> wake, metrics::ActorMetrics* metrics = nullptr);
  ~EpisodeRunner();

  // A granted prompt with an environment: its n episodes start (kAddGroup once all did).
  void StartGroup(const prl::v1::LeasedPrompt& lease, int64_t max_sequence_tokens);
  // The group is in the engine as request_id.
  void Bind(const std::string& lease_id, uint64_t request_id);
  // A sample's turn ended: its environment answers.
  void OnTurn(const TurnOutput& turn);
  std::vector<Action> TakeActions();
  // Applies one action to `engine` (from the engine loop): kAddGroup adds the group's prompt
  // with `base` (the lease's sampling) made multi-turn with the action's turn limit and turn
  // end, returning its request id; kContinue and kFinish go on or end a paused sample (0);
  // kAbort returns its failure. The caller binds an added group (Bind) and, on an error,
  // aborts the group.
  static absl::StatusOr<uint64_t> Apply(Engine& engine, Action& action, SamplingParams base);
  // An episode group's outcome once every sample finished (then forgotten; empty for a request
  // that is not an episode group's). Forget drops an aborted group.
  std::vector<EpisodeOutcome> TakeOutcome(uint64_t request_id);
  void Forget(const std::string& lease_id);
  // Environment calls in flight or actions not yet taken.
  bool Busy() const;

 private:
  struct Episode;
  struct Group;
  void Run();  // a pool thread
  void Post(std::function<void()> job);
  void Push(Action action);
  void StartEpisode(const std::string& lease_id, int32_t sample);
  // Runs one environment call, timing it (prl_environment_latency_seconds).
  template <typename Call>
  auto Timed(Call&& call) -> decltype(call());
  void Step(const std::string& lease_id, TurnOutput turn);

  std::shared_ptr<const tokenizer::TextCodec> codec_;
  std::function<void()> wake_;
  metrics::ActorMetrics* metrics_;  // null: none
  EnvironmentPool environments_;
  mutable std::mutex mu_;
  std::condition_variable work_;
  std::map<std::string, std::shared_ptr<Group>> groups_;  // by lease id
  std::map<uint64_t, std::string> by_request_;
  std::deque<std::function<void()>> jobs_;
  int64_t running_jobs_ = 0;
  std::vector<Action> actions_;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace prl::actor
