// EpisodeEngine: the inference engine together with the episodes of the groups in it — what the
// actor's engine loop and `prl run`'s held-out evaluation both drive (docs/environments.md).
//
//   EpisodeEngine episodes(std::move(engine), codec, options, wake);
//   episodes.Add(group);                     // one turn: into the engine; episodes: started first
//   while (...) {
//     PRL_RETURN_IF_ERROR(episodes.Step());  // answers applied, one engine step, turns handed on
//     for (FinishedGroup& g : episodes.TakeFinished()) ...;   // every sample done
//     for (FailedGroup& g : episodes.TakeFailed()) ...;       // release it, with the reason
//   }
//
// A group of one turn goes into the engine as it is. A group with an environment runs one
// episode per sample:
//   1. StartEpisode for every sample; the samples share the prompt and its first observation
//      (a chat prompt is rendered again with the observation after its messages:
//      episode/turn_renderer.h); then the group enters the engine, multi-turn, its first turn
//      capped by max_episode_tokens and the context (a first prompt that leaves no room for a
//      single token fails the group, naming the sizes);
//   2. each time a sample's turn ends (a stop token, a stop string anywhere in the turn's new
//      text: episode/stop_strings.h, or the turn's budget), the engine pauses it with its KV
//      cache and the turn goes to the environment (Step); the reply, rendered as a delta, is
//      appended and the sample goes on (Continue), or it ends: the environment said done, or a
//      limit (max_turns, max_episode_tokens, the context: EndEpisode scores it as truncated);
//   3. when every sample ended, the group is finished, with each episode's outcome.
// Environment calls run on the environment's own threads (episode/environment_pool.h), never
// on the engine's: their answers wait in an inbox that Step applies, and `wake` is called when
// one arrives.
//
// Failures: any error of an episode (an environment error after its retries, a malformed
// answer, a reply the template cannot render) ends the whole group at once — out of the engine,
// every one of its episodes told (EndEpisode, aborted) — and the group is handed back as failed
// exactly once; answers that arrive for it later are dropped. Nothing half-finished is
// finished. An environment found down (UNAVAILABLE), or one that lost an episode across an
// outage (NOT_FOUND or FAILED_PRECONDITION after it was down), is an outage, not a failure:
// the group leaves the engine and waits, and starts again (new episode ids) when the
// environment is back; only when it stays down longer than the outage budget (or a group met
// more than 8 outages) do its groups fail. Abort gives a group up from outside (reclaimed, its
// lease lost, the actor stopping), its environment told too.
//
// Owns: the engine, every group's state (one map, by group id), the environment pool and the
// inbox. Thread-safety: one thread (the engine loop) calls everything; `wake` runs on the
// environments' threads and must not call back in.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "episode/environment_pool.h"
#include "episode/group.h"
#include "episode/turn_renderer.h"
#include "inference_engine/engine.h"
#include "metrics/prl_metrics.h"
#include "tokenizer/text_codec.h"

namespace prl::episode {

struct EpisodeEngineOptions {
  int32_t calls_per_environment = 16;  // actors.env_calls_per_address
  // How long an environment may stay down while its groups wait (actors.env_outage_s).
  absl::Duration outage_budget = absl::Minutes(5);
  metrics::ActorMetrics* metrics = nullptr;  // prl_episode_*, prl_environment_* (null: none)
};

// Groups held, by where they are.
struct EpisodeCounts {
  int64_t in_engine = 0;  // one turn or episodes, in the engine
  int64_t starting = 0;   // episodes starting (StartEpisode)
  int64_t waiting = 0;    // waiting for an environment that is down
  int64_t samples_in_engine = 0;
};

class EpisodeEngine {
 public:
  // `codec` renders and decodes the episodes' text (null: groups with an environment fail).
  EpisodeEngine(std::unique_ptr<Engine> engine, std::shared_ptr<const tokenizer::TextCodec> codec,
                EpisodeEngineOptions options, std::function<void()> wake);
  // Gives every group up (their environments told, best effort) and stops the calls.
  ~EpisodeEngine();

  Engine& engine() { return *engine_; }
  const Engine& engine() const { return *engine_; }

  // A group in. One turn: an error is the engine's refusal (nothing is held). Episodes: OK, and
  // a failure to start comes back through TakeFailed.
  absl::Status Add(GroupRequest group);
  // Gives a group up: out of the engine, its episodes told (EndEpisode, aborted, with
  // `reason`). False when the group is not held (finished, failed or unknown).
  bool Abort(const std::string& id, const std::string& reason);
  // Applies the environments' answers, restarts groups whose environment is back (and fails
  // those whose outage outlasted the budget), runs one engine step when the engine has
  // sequences to run, and hands the turns that ended to their episodes.
  absl::Status Step();
  std::vector<FinishedGroup> TakeFinished();
  std::vector<FailedGroup> TakeFailed();

  // Whether Step would run the engine or apply an answer now; else the caller may wait for
  // `wake` (or a little while: outages are polled by Step).
  bool Runnable() const;
  bool Holds(const std::string& id) const { return groups_.count(id) > 0; }
  bool empty() const { return groups_.empty(); }
  EpisodeCounts counts() const;

 private:
  struct Answer;
  struct Sample;
  struct Group;
  class Inbox;

  // Calls: each runs on the group's environment's threads and leaves an Answer in the inbox.
  void CallStart(Group& g, int32_t sample);
  void CallStep(Group& g, TurnOutput turn);
  void CallEnd(Group& g, int32_t sample, const std::string& reason);
  void NotifyAborted(const Group& g, const std::string& reason);

  // The answers, applied on the engine loop's thread.
  void Apply(Answer& a);
  void OnStarted(Group& g, Answer& a);
  void OnStepped(Group& g, Answer& a);
  void OnEnded(Group& g, Answer& a);

  void StartEpisodes(Group& g);
  void Launch(Group& g);  // every sample started: into the engine
  void Fail(Group& g, const absl::Status& why);
  void AbortInEngine(Group& g);
  void PollOutages(absl::Time now);
  void CollectFinished();

  std::unique_ptr<Engine> engine_;
  std::shared_ptr<const tokenizer::TextCodec> codec_;
  EpisodeEngineOptions options_;
  std::unique_ptr<Inbox> inbox_;
  std::map<std::string, std::unique_ptr<Group>> groups_;  // by group id
  std::map<uint64_t, std::string> by_request_;  // engine request id -> group id (in groups_)
  std::vector<FinishedGroup> finished_;
  std::vector<FailedGroup> failed_;
  EnvironmentPool pool_;  // after the inbox: its threads stop before the inbox goes
};

}  // namespace prl::episode
