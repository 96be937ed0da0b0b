// The episode engine's state (episode/episode_engine.h), shared by its two source files:
// episode_engine.cc (groups in and out, the loop, the answers) and episode_calls.cc (the calls,
// on the environments' threads). Internal to episode/: nothing else includes it.
#pragma once

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
#include "episode/episode_engine.h"
#include "episode/tool_calls.h"

namespace prl::episode {

// One environment call's result, left in the inbox by the call's thread.
struct EpisodeEngine::Answer {
  enum class Kind { kStart, kStep, kEnd } kind = Kind::kStart;
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
