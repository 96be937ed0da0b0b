// The built-in guessing game (docs/environments.md): a multi-turn environment whose later turns
// depend on the earlier ones. The secret is the prompt's reference (an integer in [low, high]);
// each model turn's last integer is a guess, answered "higher" or "lower" as a user message,
// until the guess is right (episode reward 1, done) or the guesses run out (reward 0, done). A
// turn without an integer is answered with the rules and counts as a guess. Binary search
// finds any secret in [1, 100] within 7 guesses.
//
// Parameters: low (default 1), high (default 100), max_guesses (default the actor's max_turns),
// and the feedback's words higher_text, lower_text, rules_text (a model whose vocabulary has no
// letters, like the built-in character tokenizer's, gets e.g. "+" and "-").
// An episode truncated by a limit scores 0.
//
// Thread-safety: GuessNumberEnvironment may be called from many threads.
#pragma once

#include <cstdint>
#include <string>

#include "env/environment.h"
#include "env/episode_table.h"

namespace prl::env {

// The parameters' defaults (what a player must read and write when it gives none).
inline constexpr int64_t kDefaultLow = 1, kDefaultHigh = 100;
inline constexpr char kDefaultHigherText[] = "higher", kDefaultLowerText[] = "lower";
std::string DefaultRulesText(int64_t low, int64_t high);

class GuessNumberEnvironment final : public Environment {
 public:
  absl::StatusOr<v1::StartEpisodeResponse> StartEpisode(
      const v1::StartEpisodeRequest& request) override;
  absl::StatusOr<v1::StepResponse> Step(const v1::StepRequest& request) override;
  absl::StatusOr<v1::EndEpisodeResponse> EndEpisode(const v1::EndEpisodeRequest& request) override;

 private:
  struct State {
    int64_t secret = 0, low = 1, high = 100;
    int64_t max_guesses = 0, guesses = 0;
    std::string higher, lower, rules;  // the feedback's words
  };
  EpisodeTable<State> episodes_;
};

}  // namespace prl::env
