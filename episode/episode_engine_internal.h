// The episode engine's state (episode/episode_engine.h), shared by its two source files:
// episode_engine.cc (groups in and out, the loop, the answers) and episode_calls.cc (the calls,
// on the environments' threads). Internal to episode/: nothing else includes it.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "env/remote_agent.h"
#include "episode/episode_engine.h"
#include "episode/stop_strings.h"
#include "episode/tool_calls.h"
#include "episode/trajectory.h"
#include "prl/v1/agent.pb.h"

namespace prl::episode {

// An agent's call to the endpoint (episode/agent_gateway.h), from its arrival to its answer.
struct EpisodeEngine::AgentCall {
  openai::ChatCall call;
  openai::CompletionBackend::Progress progress;  // null: not streamed
  openai::CompletionBackend::Done done;
  absl::Time arrived;
  int32_t index = 0;  // the episode's call number, from 0
  // Once rendered: how it starts, its forced tool-call opening (text and tokens), the context
  // it continues (tokens before the opening), and the content streamed so far.
  CallPrompt start;
  std::string opening;
  std::vector<int32_t> opening_tokens;
  int64_t context_tokens = 0;
  std::string shown;
  std::shared_ptr<StopStrings> stops;  // the call's stop strings (null: none)
  std::atomic<bool> answered{false};

  // Whether the caller may answer it: true once (done is called exactly once).
  bool Claim() { return !answered.exchange(true); }
  // The engine's turn-end hook while it generates: the call's stop strings end the turn; a
  // streamed call is shown the content so far (episode/trajectory.h: VisibleContent).
  bool EndsTurn(const tokenizer::TextCodec& codec, ToolCallFormat format,
                absl::Span<const int32_t> turn) {
    if (stops != nullptr && stops->CompletedBy(turn)) return true;
    if (progress) {
      absl::StatusOr<std::string> text = codec.DecodeCompletion(turn);
      if (text.ok()) {
        std::string visible = VisibleContent(opening + *text, call, format);
        if (visible.size() > shown.size() && visible.compare(0, shown.size(), shown) == 0) {
          shown = std::move(visible);
          progress(shown);
        }
      }
    }
    return false;
  }
};

// An agent's episode: its key, its calls, and the trajectories (records) they made.
struct EpisodeEngine::AgentEpisode {
  std::string episode_id, key;
  // Set when the episode's group ends: its RunEpisode, still queued behind other episodes' on
  // the agent's address, is then dropped, never sent (agent_calls.cc: CallRun).
  std::shared_ptr<std::atomic<bool>> ended = std::make_shared<std::atomic<bool>>(false);
  bool returned = false;  // RunEpisode answered
  int32_t calls = 0;      // calls accepted
  int64_t tokens = 0;     // the trajectories' tokens after their first prompts (the budget)
  std::optional<Trajectory> open;  // the trajectory calls continue (none: the next starts one)
  uint64_t request_id = 0;         // its engine request (one sample, paused between calls)
  int64_t prompt_tokens = 0, sequence_tokens = 0;  // its prompt, and all its tokens so far
  int32_t segments_started = 0;
  std::vector<uint32_t> call_ends;    // its calls' ends (completion index)
  std::vector<int32_t> call_numbers;  // and which call of the episode each was
  std::shared_ptr<AgentCall> call;    // the call in progress
  // The turn-end hook's view of the call (read on the engine thread while it generates).
  std::shared_ptr<std::shared_ptr<AgentCall>> live;
  // Trajectories finishing in the engine with their calls' ends and numbers (by request id:
  // their order), and the finished ones (records) with their calls' numbers.
  struct Calls {
    std::vector<uint32_t> ends;
    std::vector<int32_t> numbers;
  };
  std::map<uint64_t, Calls> closing;
  std::map<uint64_t, EpisodeSegment> segments;
  std::map<uint64_t, std::vector<int32_t>> segment_calls;
  prl::v1::RunEpisodeResponse result;
};

// An agent's address: its client and the threads its RunEpisode calls wait on.
struct EpisodeEngine::AgentLink {
  AgentLink(std::shared_ptr<env::RemoteAgent> c, int threads)
      : client(std::move(c)), calls(threads) {}
  ~AgentLink() {
    client->Shutdown();
    calls.Shutdown();
  }
  std::shared_ptr<env::RemoteAgent> client;
  CallQueue calls;
};

// One environment call's result, left in the inbox by the call's thread.
struct EpisodeEngine::Answer {
  enum class Kind {
    kStart,
    kStep,
    kEnd,  // an environment's
    kCall,
    kRendered,
    kAnswered,
    kReturned  // an agent's (a call; RunEpisode's answer)
  } kind = Kind::kStart;
  std::string group_id;
  int32_t attempt = 0;  // the group's attempt the call belongs to (older ones are dropped)
  int32_t sample = 0;
  absl::Status status;
  // kStart: the first prompt (the prompt and the first observation) and the stop strings.
  // kStep: the reply rendered as a delta; the turn's token count; the environment's answer.
  std::vector<int32_t> tokens;
  std::vector<std::string> stop_strings;
  std::optional<ChatContext> chat;  // kStart: the context with the environment's tools
  int64_t turn_tokens = 0;
  v1::StepResponse step;
  // kEnd: the episode's reward and the limit that ended it.
  double reward = 0;
  std::string reason;
  // kCall: the call; kRendered: how it starts (in call->start, its opening tokens); kAnswered:
  // the trajectory after the answer; kReturned: RunEpisode's answer.
  std::shared_ptr<AgentCall> call;
  std::optional<Trajectory> trajectory;
  prl::v1::RunEpisodeResponse returned;

  // An answer of `kind` to sample `sample` of the group's attempt.
  static Answer For(Kind kind, std::string group_id, int32_t attempt, int32_t sample) {
    Answer a;
    a.kind = kind;
    a.group_id = std::move(group_id);
    a.attempt = attempt;
    a.sample = sample;
    return a;
  }
};

struct EpisodeEngine::Sample {
  std::string episode_id;
  int32_t turns = 0;              // turns the environment answered
  int64_t completion_tokens = 0;  // the model's and the environment's so far
  bool ended = false;             // the environment said done, or EndEpisode scored it
  EpisodeOutcome outcome;
};

struct EpisodeEngine::Group {
  enum class Phase { kStarting, kWaiting, kInEngine } phase = Phase::kInEngine;
  GroupRequest request;
  std::shared_ptr<Endpoint> endpoint;  // null: one turn
  std::shared_ptr<env::Environment> client;
  ChatContext chat;
  int32_t attempt = 0;  // restarts after outages
  uint64_t epoch = 0;   // the endpoint's outages when the episodes started
  uint64_t request_id = 0;
  std::vector<Sample> samples;
  int32_t answered = 0;  // starts answered (kStarting)
  std::optional<std::vector<int32_t>> first_prompt;
  std::vector<std::string> stop_strings;
  ToolCallFormat tool_format = ToolCallFormat::kNone;  // how its turns' tool calls are parsed
  // Agents: the agent's address and each sample's episode.
  std::shared_ptr<AgentLink> agent;
  std::vector<AgentEpisode> agents;
};

// The answers the environments' threads leave for the engine loop.
class EpisodeEngine::Inbox {
 public:
  explicit Inbox(std::function<void()> wake) : wake_(std::move(wake)) {}
  void Put(Answer a) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      answers_.push_back(std::move(a));
    }
    if (wake_) wake_();
  }
  std::vector<Answer> Take() {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<Answer> out;
    out.swap(answers_);
    return out;
  }
  bool empty() const {
    std::lock_guard<std::mutex> lock(mu_);
    return answers_.empty();
  }

 private:
  std::function<void()> wake_;
  mutable std::mutex mu_;
  std::vector<Answer> answers_;
};

namespace internal {

// A call's latency into prl_environment_latency_seconds; the endpoint learns whether it is up.
template <typename Call>
auto Timed(metrics::ActorMetrics* metrics, Endpoint& endpoint, Call&& call) -> decltype(call()) {
  const absl::Time start = absl::Now();
  auto result = call();
  if (metrics != nullptr) {
    metrics->environment_latency_seconds.Observe(absl::ToDoubleSeconds(absl::Now() - start));
  }
  endpoint.Observe(result.status());
  return result;
}

}  // namespace internal

}  // namespace prl::episode
