// EpisodeTable: the per-episode state of an environment that keeps state between turns, with
// the protocol's idempotency built in (proto/prl/v1/environment.proto): a StartEpisode retried
// with the same episode id keeps the state it created, a Step retried with the turn index it
// just answered gets the same answer again, a retried EndEpisode gets the same reward, and a
// Step out of turn order is refused naming the turn expected. A finished episode (the
// environment said done, or EndEpisode — also an aborted one's) leaves the live table and its
// last answer is kept for retries. At most max_episodes are kept in all: beyond, the oldest
// finished one is forgotten first, and only when none is left the oldest live one (its actor
// gets NOT_FOUND and fails that attempt).
//
// Thread-safety: every method may be called from any thread (one mutex; `step` and `end` run
// under it, so they must be quick: a built-in game's move, not a sandbox run).
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "prl/v1/environment.pb.h"

namespace prl::env {

template <typename State>
class EpisodeTable {
 public:
  explicit EpisodeTable(size_t max_episodes = 100'000) : max_episodes_(max_episodes) {}

  // Creates the episode's state with `make` unless it exists (a retried start).
  void Start(const std::string& episode_id, const std::function<State()>& make) {
    std::lock_guard<std::mutex> lock(mu_);
    if (live_.count(episode_id) > 0 || finished_.count(episode_id) > 0) return;
    const uint64_t seq = next_seq_++;
    live_.emplace(episode_id, Live{make(), seq, -1, {}});
    start_order_[seq] = episode_id;
    Bound();
  }

  // Runs `step` on the episode's state for turn request.turn_index (or returns the answer a
  // retried turn got). An answer that says done finishes the episode.
  absl::StatusOr<v1::StepResponse> Step(
      const v1::StepRequest& request,
      const std::function<absl::StatusOr<v1::StepResponse>(State&)>& step) {
    std::lock_guard<std::mutex> lock(mu_);
    const std::string& id = request.episode_id();
    auto it = live_.find(id);
    if (it == live_.end()) {
      auto done = finished_.find(id);
      if (done != finished_.end() && done->second.last_turn == request.turn_index()) {
        return done->second.step;
      }
      return absl::NotFoundError(
          absl::StrCat("episode '", id, "'", done != finished_.end() ? " is over" : " is unknown",
                       ": no turn ", request.turn_index(), " (not started, finished, or dropped)"));
    }
    Live& e = it->second;
    if (request.turn_index() == e.last_turn && e.last_turn >= 0) return e.last_answer;
    if (request.turn_index() != e.last_turn + 1) {
      return absl::FailedPreconditionError(
          absl::StrCat("episode '", id, "': turn_index ", request.turn_index(),
                       " out of order (expected ", e.last_turn + 1, ")"));
    }
    absl::StatusOr<v1::StepResponse> answer = step(e.state);
    if (!answer.ok()) return answer;
    e.last_turn = request.turn_index();
    e.last_answer = *answer;
    if (answer->done()) Finish(it, Finished{e.last_turn, *answer, {}});
    return answer;
  }

  // Runs `end` on the episode's state (its final score) and finishes the episode; a retried
  // end gets the answer the first one got.
  absl::StatusOr<v1::EndEpisodeResponse> End(
      const v1::EndEpisodeRequest& request,
      const std::function<v1::EndEpisodeResponse(State&)>& end) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = live_.find(request.episode_id());
    if (it == live_.end()) {
      auto done = finished_.find(request.episode_id());
      if (done != finished_.end() && done->second.end.has_value()) return *done->second.end;
      return absl::NotFoundError(absl::StrCat("episode '", request.episode_id(), "'",
                                              done != finished_.end()
                                                  ? " is over: the environment ended it"
                                                  : " is unknown: not started, or dropped"));
    }
    v1::EndEpisodeResponse answer = end(it->second.state);
    Finish(it, Finished{it->second.last_turn, it->second.last_answer, answer});
    return answer;
  }

  size_t live() const {
    std::lock_guard<std::mutex> lock(mu_);
    return live_.size();
  }
  size_t finished() const {
    std::lock_guard<std::mutex> lock(mu_);
    return finished_.size();
  }

 private:
  struct Live {
    State state;
    uint64_t seq;            // start order
    int32_t last_turn = -1;  // the last turn answered
    v1::StepResponse last_answer;
  };
  struct Finished {
    int32_t last_turn;
    v1::StepResponse step;
    std::optional<v1::EndEpisodeResponse> end;
  };

  void Finish(typename std::map<std::string, Live>::iterator it, Finished finished) {
    const std::string id = it->first;
    start_order_.erase(it->second.seq);
    live_.erase(it);
    finished_[id] = std::move(finished);
    finished_order_.push_back(id);
    Bound();
  }

  // Keeps live + finished within max_episodes: the oldest finished first, then the oldest live.
  void Bound() {
    while (live_.size() + finished_.size() > max_episodes_ && !finished_order_.empty()) {
      finished_.erase(finished_order_.front());
      finished_order_.pop_front();
    }
    while (live_.size() > max_episodes_) {
      live_.erase(start_order_.begin()->second);
      start_order_.erase(start_order_.begin());
    }
  }

  size_t max_episodes_;
  mutable std::mutex mu_;
  std::map<std::string, Live> live_;
  std::map<uint64_t, std::string> start_order_;  // live episodes by start order
  uint64_t next_seq_ = 0;
  std::map<std::string, Finished> finished_;
  std::deque<std::string> finished_order_;
};

}  // namespace prl::env
