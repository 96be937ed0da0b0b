// What goes into an EpisodeEngine (episode/episode_engine.h) and what comes out: a group of n
// samples of one prompt, one turn or agentic episodes against an environment
// (docs/environments.md), and the group's end (finished with its samples and episodes'
// outcomes, or failed with the reason).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "inference_engine/engine.h"
#include "prl/v1/prompt.pb.h"

namespace prl::episode {

struct GroupRequest {
  // Unique among the engine's groups (the actor's lease id); episode ids are "<id>/<sample>"
  // ("<id>/<sample>~<k>" for the k-th restart after an environment's outage).
  std::string id;
  std::vector<int32_t> prompt;  // token ids
  // n samples, temperature, top-p/k, stop ids, seed; max_tokens: the completion's (one turn)
  // or a turn's (episodes: environment.max_tokens_per_turn).
  SamplingParams params;
  // Agentic episodes: the environment and its limits (defaults filled in); absent: one turn.
  std::optional<prl::v1::EnvironmentSpec> environment;
  // Agents (docs/agents.md): the agent and its limits (defaults filled in); at most one of
  // environment and agent.
  std::optional<prl::v1::AgentSpec> agent;
  std::string reference;             // StartEpisodeRequest.reference
  prl::v1::EpisodePrompt submitted;  // the prompt as submitted (text or chat), when known
  // A run of adapters (docs/tenants.md): the engine adapter its samples use (Engine::AddAdapter's
  // name, the adapter's id); empty: none.
  std::string adapter;
};

// One record of an agent's episode: one trajectory of its calls (episode/trajectory.h).
struct EpisodeSegment {
  std::vector<int32_t> prompt;
  SampleOutput output;                // sample_index: the episode's
  std::vector<uint32_t> turn_ends;    // completion index past each call's answer
  std::vector<double> turn_rewards;   // the agent's call rewards (0 when it gave none)
};

// What an agentic episode ended with, per sample, for its record
// (replay/rollout_record.h: turn_ends, turn_rewards; the reward).
struct EpisodeOutcome {
  double reward = 0;                // the episode's: what the group's advantages use
  std::vector<uint32_t> turn_ends;  // completion index past each model turn
  std::vector<double> turn_rewards;
  bool truncated = false;  // ended by a limit (max_turns, max_episode_tokens, the context)
  std::string reason;      // the environment's done_reason, or the limit reached
  // Agents: the episode's records in order, each with its own prompt (more than one when the
  // agent rewrote its history: docs/agents.md). Empty for an environment's episode, whose one
  // record is the group's output sample.
  std::vector<EpisodeSegment> segments;
};

struct FinishedGroup {
  std::string id;
  // output.prompt: the prompt the samples continued. Agents: each sample's last record, and
  // sample 0's last prompt (the records are the episodes' segments).
  RequestOutput output;
  std::vector<EpisodeOutcome> episodes;  // by sample; empty for one turn
};

// A group whose episodes failed (an environment error, a malformed answer, an environment down
// longer than the outage budget): nothing of it is trained; the caller releases it.
struct FailedGroup {
  std::string id;
  absl::Status why;  // names the episode, the environment and what went wrong
};

}  // namespace prl::episode
