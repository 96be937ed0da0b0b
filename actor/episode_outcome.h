// EpisodeOutcome: what an agentic episode ended with (actor/episode_runner.h), per sample, for
// its record (replay/rollout_record.h: turn_ends, turn_rewards; the reward).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace prl::actor {

struct EpisodeOutcome {
  double reward = 0;                // the episode's: what the group's advantages use
  std::vector<uint32_t> turn_ends;  // completion index past each model turn
  std::vector<double> turn_rewards;
  bool truncated = false;  // ended by a limit (max_turns, max_episode_tokens, the context)
  std::string reason;      // the environment's done_reason, or the limit reached
};

}  // namespace prl::actor
