// The jobs of agents' episodes (episode/episode_engine.h, docs/agents.md), off the engine loop:
// RunEpisode on the agent's own threads, and each call's rendering and answer on the render
// threads. Each leaves an Answer in the inbox; a call's answer goes to the agent after the
// inbox has the trajectory it extends, so the agent's next call finds it.
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "episode/episode_engine_internal.h"

namespace prl::episode {

namespace v1 = prl::v1;

void EpisodeEngine::CallRun(Group& g, int32_t sample) {
  const AgentEpisode& e = g.agents[sample];
  const v1::AgentSpec& spec = *g.request.agent;
  v1::RunEpisodeRequest request;
  request.set_episode_id(e.episode_id);
  request.set_agent(spec.name());
  *request.mutable_parameters() = spec.parameters();
  *request.mutable_prompt() = g.request.submitted;
  request.set_reference(g.request.reference);
  request.set_sample_index(sample);
  request.set_group_size(g.request.params.n);
  request.set_base_url(base_url_);
  request.set_api_key(e.key);
  request.set_model(model_name_);
  v1::AgentLimits* limits = request.mutable_limits();
  limits->set_max_calls(spec.max_calls());
  limits->set_max_tokens_per_call(spec.max_tokens_per_call());
  limits->set_max_episode_tokens(spec.max_episode_tokens());
  limits->set_timeout_s(spec.timeout_s());
  g.agent->calls.Post([inbox = inbox_.get(), client = g.agent->client, group = g.request.id,
                       attempt = g.attempt, sample, timeout = absl::Seconds(spec.timeout_s()),
                       request = std::move(request), ended = e.ended] {
    Answer a = Answer::For(Answer::Kind::kReturned, group, attempt, sample);
    if (ended->load()) {  // the group ended while this waited its turn: never sent
      a.status = absl::CancelledError(
          absl::StrCat("episode ", request.episode_id(), " ended before its RunEpisode was sent"));
      return inbox->Put(std::move(a));
    }
    absl::StatusOr<v1::RunEpisodeResponse> returned = client->RunEpisode(request, timeout);
    a.status = returned.status();
    if (returned.ok()) a.returned = *std::move(returned);
    inbox->Put(std::move(a));
  });
}

void EpisodeEngine::RenderCall(Group& g, int32_t sample) {
  const AgentEpisode& e = g.agents[sample];
  renders_.Post([inbox = inbox_.get(), codec = codec_, group = g.request.id, attempt = g.attempt,
                 sample, call = e.call, open = e.request_id != 0 ? e.open : std::nullopt,
                 kwargs = g.chat.kwargs, format = g.tool_format] {
    Answer a = Answer::For(Answer::Kind::kRendered, group, attempt, sample);
    a.call = call;
    absl::StatusOr<CallPrompt> start =
        StartCall(*codec, open.has_value() ? &*open : nullptr, call->call, kwargs);
    a.status = start.status();
    if (start.ok()) {
      call->start = *std::move(start);
      call->opening = call->call.chat ? ForcedOpening(format, call->call) : "";
      if (!call->opening.empty()) {
        absl::StatusOr<std::vector<int32_t>> tokens = codec->EncodeContinuation(call->opening);
        a.status = tokens.status();
        if (tokens.ok()) call->opening_tokens = *std::move(tokens);
      }
    }
    inbox->Put(std::move(a));
  });
}

void EpisodeEngine::AnswerTurn(Group& g, int32_t sample, TurnOutput turn) {
  AgentEpisode& e = g.agents[sample];
  if (e.call == nullptr) return;
  *e.live = nullptr;  // the turn is over: the hook no longer streams it
  const int64_t sampled = static_cast<int64_t>(turn.tokens.size());
  e.sequence_tokens += sampled;
  e.tokens += sampled;
  e.call_ends.push_back(static_cast<uint32_t>(e.sequence_tokens - e.prompt_tokens));
  e.call_numbers.push_back(e.call->index);
  renders_.Post([inbox = inbox_.get(), codec = codec_, group = g.request.id, attempt = g.attempt,
                 sample, call = e.call, format = g.tool_format, model = model_name_,
                 episode_id = e.episode_id, turn = std::move(turn)] {
    const AgentCall& c = *call;
    openai::Completion out;
    out.chat = c.call.chat;
    out.model = model;
    out.created = absl::ToUnixSeconds(absl::Now());
    absl::StatusOr<std::string> text = codec->DecodeCompletion(turn.tokens);
    AnswerText answer =
        ReadAnswer(c.opening + (text.ok() ? *text : std::string()), c.call, format,
                   turn.reason == FinishReason::kLength, absl::StrCat(episode_id, "/", c.index));
    out.content = answer.content;
    out.reasoning_content = answer.reasoning;
    out.tool_calls = answer.tool_calls;
    out.finish_reason = answer.finish_reason;
    out.prompt_tokens = c.context_tokens;
    // The forced opening (context), then what the model sampled.
    const int64_t version = turn.versions.empty() ? 0 : turn.versions.front();
    for (int32_t t : c.opening_tokens) {
      out.token_ids.push_back(t);
      out.logprobs.push_back(0.0f);
      out.versions.push_back(version);
      out.sources.push_back(1);
    }
    out.token_ids.insert(out.token_ids.end(), turn.tokens.begin(), turn.tokens.end());
    out.logprobs.insert(out.logprobs.end(), turn.logprobs.begin(), turn.logprobs.end());
    out.versions.insert(out.versions.end(), turn.versions.begin(), turn.versions.end());
    out.sources.insert(out.sources.end(), turn.tokens.size(), 0);
    if (c.call.logprobs) {  // the sampled tokens, as OpenAI lists them
      out.with_logprobs = true;
      const auto piece = [&](int32_t id) {
        absl::StatusOr<std::string> s = codec->DecodeCompletion(absl::MakeConstSpan(&id, 1));
        return s.ok() ? *s : std::string();
      };
      for (size_t i = 0; i < turn.tokens.size(); ++i) {
        out.token_texts.push_back(piece(turn.tokens[i]));
        std::vector<std::pair<std::string, float>> top;
        if (i < turn.alternatives.size()) {
          for (const auto& [id, lp] : turn.alternatives[i]) top.emplace_back(piece(id), lp);
        }
        out.top_logprobs.push_back(std::move(top));
      }
    }
    std::vector<int32_t> answer_tokens = c.opening_tokens;
    answer_tokens.insert(answer_tokens.end(), turn.tokens.begin(), turn.tokens.end());
    Answer a = Answer::For(Answer::Kind::kAnswered, group, attempt, sample);
    a.call = call;
    a.trajectory = Answered(c.start, answer, answer_tokens);
    inbox->Put(std::move(a));  // first: the agent's next call must find the trajectory
    if (call->Claim()) call->done(std::move(out));
  });
}

}  // namespace prl::episode
