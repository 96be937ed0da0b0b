#include "env/guess_number.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "env/calculator.h"

namespace prl::env {

std::string DefaultRulesText(int64_t low, int64_t high) {
  return absl::StrCat("guess a number from ", low, " to ", high);
}

absl::StatusOr<v1::StartEpisodeResponse> GuessNumberEnvironment::StartEpisode(
    const v1::StartEpisodeRequest& request) {
  State s;
  const auto& params = request.parameters();
  PRL_ASSIGN_OR_RETURN(s.low, IntParameter(params, "low", kDefaultLow, "guess_number"));
  PRL_ASSIGN_OR_RETURN(s.high, IntParameter(params, "high", kDefaultHigh, "guess_number"));
  PRL_ASSIGN_OR_RETURN(s.max_guesses,
                       IntParameter(params, "max_guesses", request.max_turns(), "guess_number"));
  if (!absl::SimpleAtoi(request.reference(), &s.secret) || s.secret < s.low ||
      s.secret > s.high) {
    return absl::InvalidArgumentError(absl::StrCat(
        "guess_number: reference: expected the secret, an integer in [", s.low, ", ", s.high,
        "], found '", request.reference().substr(0, 32), "'"));
  }
  if (s.max_guesses < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "guess_number: max_guesses (or the actor's max_turns): expected >= 1, found ",
        s.max_guesses));
  }
  s.higher = Parameter(request, "higher_text", kDefaultHigherText);
  s.lower = Parameter(request, "lower_text", kDefaultLowerText);
  s.rules = Parameter(request, "rules_text", DefaultRulesText(s.low, s.high));
  episodes_.Start(request.episode_id(), [&] { return s; });
  return v1::StartEpisodeResponse();
}

absl::StatusOr<v1::StepResponse> GuessNumberEnvironment::Step(const v1::StepRequest& request) {
  return episodes_.Step(request, [&](State& s) -> absl::StatusOr<v1::StepResponse> {
    v1::StepResponse response;
    ++s.guesses;
    int64_t guess = 0;
    const bool has_guess = LastInteger(request.text(), &guess);
    if (has_guess && guess == s.secret) {
      response.set_done(true);
      response.set_episode_reward(1.0);
      response.set_done_reason(absl::StrCat("solved in ", s.guesses, " guesses"));
      return response;
    }
    if (s.guesses >= s.max_guesses) {
      response.set_done(true);
      response.set_episode_reward(0.0);
      response.set_done_reason(absl::StrCat("out of guesses (", s.max_guesses, ")"));
      return response;
    }
    v1::EnvMessage* reply = response.add_messages();
    reply->set_role("user");
    reply->set_content(!has_guess ? s.rules : guess < s.secret ? s.higher : s.lower);
    return response;
  });
}

absl::StatusOr<v1::EndEpisodeResponse> GuessNumberEnvironment::EndEpisode(
    const v1::EndEpisodeRequest& request) {
  return episodes_.End(request, [](State&) { return v1::EndEpisodeResponse(); });
}

}  // namespace prl::env
