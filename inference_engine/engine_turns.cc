// Multi-turn requests (declared in engine.h): a sample's turn ends and pauses it with its KV
// cache; the environment's reply is appended and the sample goes on, or its episode ends.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "inference_engine/engine.h"

namespace prl {

absl::StatusOr<Sequence*> Engine::FindSample(uint64_t request_id, int32_t sample_index) {
  auto it = requests_.find(request_id);
  if (it == requests_.end()) {
    return absl::NotFoundError(absl::StrCat("request ", request_id, " is unknown or finished"));
  }
  Request& r = *it->second;
  if (!r.params.multi_turn) {
    return absl::FailedPreconditionError(
        absl::StrCat("request ", request_id, " is not multi-turn (SamplingParams::multi_turn)"));
  }
  if (sample_index < 0 || sample_index >= static_cast<int32_t>(r.samples.size())) {
    return absl::InvalidArgumentError(absl::StrCat("request ", request_id, ": sample ",
                                                   sample_index, " is not in [0, ",
                                                   r.samples.size(), ")"));
  }
  return r.samples[sample_index].get();
}

TurnOutput Engine::PauseTurn(Sequence& seq, FinishReason reason) {
  scheduler_.Pause(&seq);
  seq.finish_reason = reason;
  TurnOutput turn;
  turn.request_id = seq.request->id;
  turn.sample_index = seq.sample_index;
  turn.tokens.assign(seq.tokens.begin() + seq.turn_start, seq.tokens.end());
  const int64_t first = seq.turn_start - seq.num_prompt_tokens;  // in the completion's arrays
  turn.logprobs.assign(seq.logprobs.begin() + first, seq.logprobs.end());
  turn.versions.assign(seq.versions.begin() + first, seq.versions.end());
  turn.alternatives = std::move(seq.turn_alternatives);
  seq.turn_alternatives.clear();
  turn.reason = reason;
  return turn;
}

std::vector<TurnOutput> Engine::TakeTurns() {
  std::vector<TurnOutput> out;
  out.swap(turns_);
  return out;
}

absl::StatusOr<TurnOutput> Engine::EndTurn(uint64_t request_id, int32_t sample_index) {
  PRL_ASSIGN_OR_RETURN(Sequence * seq, FindSample(request_id, sample_index));
  if (seq->status != SequenceStatus::kRunning && seq->status != SequenceStatus::kWaiting) {
    return absl::FailedPreconditionError(absl::StrCat("request ", request_id, " sample ",
                                                      sample_index,
                                                      ": no turn is running (paused or ended)"));
  }
  if (!seq->request->forked) {
    return absl::FailedPreconditionError(absl::StrCat(
        "request ", request_id, " sample ", sample_index, ": its first turn has not started"));
  }
  return PauseTurn(*seq, FinishReason::kStop);
}

absl::Status Engine::Continue(uint64_t request_id, int32_t sample_index,
                              absl::Span<const int32_t> tokens, int32_t max_tokens,
                              const std::optional<TurnSampling>& sampling) {
  PRL_ASSIGN_OR_RETURN(Sequence * seq, FindSample(request_id, sample_index));
  const std::string where = absl::StrCat("request ", request_id, " sample ", sample_index);
  if (seq->status != SequenceStatus::kPaused) {
    return absl::FailedPreconditionError(absl::StrCat(where, ": not paused between turns"));
  }
  if (max_tokens < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": max_tokens: expected >= 1, found ", max_tokens));
  }
  if (absl::Status ids = CheckTokenIds(tokens, "tokens"); !ids.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": ", ids.message()));
  }
  SamplingParams params = seq->request->params;
  if (sampling.has_value()) {
    if (params.n != 1) {
      return absl::FailedPreconditionError(absl::StrCat(
          where, ": a turn's own sampling needs a request of one sample (found n = ", params.n,
          "; its samples share their parameters)"));
    }
    params.temperature = sampling->temperature;
    params.top_p = sampling->top_p;
    params.seed = sampling->seed;
    params.top_logprobs = sampling->top_logprobs;
    params.max_tokens = max_tokens;
    if (absl::Status valid = ValidateSamplingParams(params, config_.vocab_size); !valid.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": ", valid.message()));
    }
  }
  const int64_t total = static_cast<int64_t>(seq->tokens.size() + tokens.size()) + max_tokens;
  if (total > max_sequence_tokens()) {
    return absl::OutOfRangeError(absl::StrCat(where, ": ", seq->tokens.size(), " tokens + ",
                                              tokens.size(), " appended + max_tokens ", max_tokens,
                                              " = ", total, " exceeds the ", max_sequence_tokens(),
                                              " tokens a sequence may hold"));
  }
  // The context the sample had computed before its pause (all but its last sampled token), and
  // what of it the KV cache still holds.
  ++stats_.turns_continued;
  stats_.turn_context_tokens += static_cast<int64_t>(seq->tokens.size()) - 1;
  stats_.turn_kept_tokens += seq->num_computed_tokens;
  // The reply: context for the next turn, never sampled (log-prob 0, the version of the token
  // before it, so that versions never decrease through it).
  const int64_t version = seq->versions.empty() ? weights_->version() : seq->versions.back();
  for (int32_t t : tokens) {
    seq->tokens.push_back(t);
    seq->logprobs.push_back(0.0f);
    seq->versions.push_back(version);
    seq->sources.push_back(1);
  }
  if (sampling.has_value()) seq->request->params = std::move(params);
  seq->turn_start = static_cast<int64_t>(seq->tokens.size());
  seq->turn_alternatives.clear();
  seq->turn_max_tokens = max_tokens;
  seq->finish_reason = FinishReason::kNone;
  scheduler_.Resume(seq);
  return absl::OkStatus();
}

absl::Status Engine::FinishSample(uint64_t request_id, int32_t sample_index) {
  PRL_ASSIGN_OR_RETURN(Sequence * seq, FindSample(request_id, sample_index));
  if (seq->status != SequenceStatus::kPaused) {
    return absl::FailedPreconditionError(absl::StrCat("request ", request_id, " sample ",
                                                      sample_index, ": not paused between turns"));
  }
  scheduler_.Finish(seq);
  Request& r = *seq->request;
  if (++r.num_finished == r.params.n) {
    FinishRequestIfDone(r);
    EraseRequest(request_id);
  }
  return absl::OkStatus();
}

}  // namespace prl
