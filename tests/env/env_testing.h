// What the environment tests share: requests of the protocol (proto/prl/v1/environment.proto).
#pragma once

#include <string>

#include "prl/v1/environment.pb.h"

namespace prl::env::testing {

inline v1::StartEpisodeRequest Start(const std::string& env, const std::string& id,
                                     const std::string& reference, int max_turns = 8) {
  v1::StartEpisodeRequest r;
  r.set_environment(env);
  r.set_episode_id(id);
  r.set_reference(reference);
  r.set_max_turns(max_turns);
  return r;
}

inline v1::StepRequest Turn(const std::string& id, int turn, const std::string& text,
                            v1::TurnEnd end = v1::TURN_END_END_OF_TURN) {
  v1::StepRequest r;
  r.set_episode_id(id);
  r.set_turn_index(turn);
  r.set_text(text);
  r.set_turn_end(end);
  return r;
}

}  // namespace prl::env::testing
