#include "env/guess_number.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "env/calculator.h"

namespace prl::env {

namespace {

absl::Status IntParam(const v1::StartEpisodeRequest& request, const std::string& key,
                      int64_t fallback, int64_t* out) {
  auto it = request.parameters().find(key);
  *out = fallback;
  if (it == request.parameters().end()) return absl::OkStatus();
  if (!absl::SimpleAtoi(it->second, out)) {
    return absl::InvalidArgumentError(absl::StrCat("guess_number: parameter ", key,
                                                   ": expected an integer, found '",
                                                   it->second.substr(0, 32), "'"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<v1::StartEpisodeResponse> GuessNumberEnvironment::StartEpisode(
    const v1::StartEpisodeRequest& request) {
  State s;
  if (absl::Status st = IntParam(request, "low", 1, &s.low); !st.ok()) return st;
  if (absl::Status st = IntParam(request, "high", 100, &s.high); !st.ok()) return st;
  if (absl::Status st = IntParam(request, "max_guesses", request.max_turns(), &s.max_guesses);
      !st.ok()) {
    return st;
  }
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
  s.higher = Parameter(request, "higher_text", "higher");
  s.lower = Parameter(request, "lower_text", "lower");
  s.rules = Parameter(request, "rules_text",
                      absl::StrCat("guess a number from ", s.low, " to ", s.high));
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
