// Agents' episodes in the episode engine (episode/episode_engine.h, docs/agents.md): a
// RunEpisode per sample, the agent's calls as turns of the episode's trajectories, and the
// records they make. Everything here runs on the engine loop's thread; the jobs it posts (the
// calls' rendering and answers, RunEpisode) are in agent_calls.cc.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "core/xxhash_inline.h"
#include "episode/episode_engine_internal.h"

namespace prl::episode {

namespace v1 = prl::v1;

namespace {

// The seed of a sample's trajectory: the given seed (the call's, else the group's) mixed with
// the sample and the trajectory's number, so that the samples of one prompt differ and a new
// trajectory does not replay an earlier one's draws.
uint64_t MixSeed(uint64_t seed, int32_t sample, int32_t trajectory) {
  const uint64_t words[3] = {seed, static_cast<uint64_t>(sample),
                             static_cast<uint64_t>(trajectory)};
  return XXH3_64bits(words, sizeof(words));
}

}  // namespace

absl::Status EpisodeEngine::ServeAgents(const openai::OpenAiServerOptions& options,
                                        const std::string& model, const std::string& base_url) {
  if (server_ != nullptr) return absl::FailedPreconditionError("the endpoint is already served");
  gateway_ = std::make_unique<AgentGateway>(
      model, [this](const EpisodeRef& episode, openai::ChatCall call,
                    openai::CompletionBackend::Progress progress,
                    openai::CompletionBackend::Done done) {
        PostCall(episode, std::move(call), std::move(progress), std::move(done));
      });
  absl::StatusOr<std::unique_ptr<openai::OpenAiServer>> server =
      openai::OpenAiServer::Start(options, gateway_.get());
  if (!server.ok()) {
    gateway_.reset();
    return server.status();
  }
  server_ = *std::move(server);
  model_name_ = model;
  base_url_ = base_url.empty() ? server_->base_url() : base_url;
  return absl::OkStatus();
}

void EpisodeEngine::PostCall(const EpisodeRef& episode, openai::ChatCall call,
                             openai::CompletionBackend::Progress progress,
                             openai::CompletionBackend::Done done) {
  Answer a = Answer::For(Answer::Kind::kCall, episode.group, episode.attempt, episode.sample);
  a.call = std::make_shared<AgentCall>();
  a.call->call = std::move(call);
  a.call->progress = std::move(progress);
  a.call->done = std::move(done);
  a.call->arrived = absl::Now();
  inbox_->Put(std::move(a));
}

void EpisodeEngine::AddAgents(Group& g) {
  const v1::AgentSpec& spec = *g.request.agent;
  absl::Status ready = absl::OkStatus();
  if (codec_ == nullptr) {
    ready = absl::FailedPreconditionError("agents need the model's text (a tokenizer)");
  } else if (gateway_ == nullptr) {
    ready = absl::FailedPreconditionError(
        "agents need the actor's OpenAI-compatible endpoint, which this process does not serve");
  }
  if (ready.ok()) {
    absl::StatusOr<ChatContext> chat = ChatContextOf(g.request.submitted);
    ready = chat.status();
    if (chat.ok()) g.chat = *std::move(chat);
  }
  if (ready.ok()) {
    absl::StatusOr<ToolCallFormat> format =
        ToolCallFormatOf(spec.tool_call_format(), *codec_, "agent.tool_call_format");
    ready = format.status();
    if (format.ok()) g.tool_format = *format;
  }
  if (ready.ok()) {
    std::shared_ptr<AgentLink>& link = agent_links_[spec.address()];
    if (link == nullptr) {
      absl::StatusOr<std::unique_ptr<env::RemoteAgent>> client =
          env::RemoteAgent::Connect(spec.address());
      ready = client.status();
      if (client.ok()) {
        link = std::make_shared<AgentLink>(std::shared_ptr<env::RemoteAgent>(*std::move(client)),
                                           options_.agent_episodes_per_address);
      } else {
        agent_links_.erase(spec.address());
      }
    }
    if (ready.ok()) g.agent = link;
  }
  if (!ready.ok()) {
    failed_.push_back({g.request.id, ready});
    groups_.erase(g.request.id);
    return;
  }
  g.phase = Group::Phase::kInEngine;
  g.agents.resize(g.request.params.n);
  for (int32_t j = 0; j < g.request.params.n; ++j) {
    AgentEpisode& e = g.agents[j];
    e.episode_id = absl::StrCat(g.request.id, "/", j);
    e.key = gateway_->Issue({g.request.id, g.attempt, j});
    e.live = std::make_shared<std::shared_ptr<AgentCall>>();
    CallRun(g, j);
  }
}

void EpisodeEngine::OnCall(Group& g, Answer& a) {
  AgentEpisode& e = g.agents[a.sample];
  std::shared_ptr<AgentCall> call = std::move(a.call);
  const v1::AgentSpec& spec = *g.request.agent;
  const auto refuse = [&](const absl::Status& why) {
    if (options_.metrics != nullptr) options_.metrics->AgentCallErrors(why.code()).Increment();
    if (call->Claim()) call->done(why);
  };
  if (e.returned) {
    return refuse(absl::UnauthenticatedError(
        absl::StrCat("episode ", e.episode_id, " has ended (its agent returned)")));
  }
  if (e.call != nullptr) {
    return refuse(absl::FailedPreconditionError(absl::StrCat(
        "call ", e.call->index + 1, " of episode ", e.episode_id,
        " is still generating: an episode's calls run one at a time")));
  }
  if (e.calls >= spec.max_calls()) {
    return refuse(absl::ResourceExhaustedError(absl::StrCat(
        "episode ", e.episode_id, " made its ", spec.max_calls(), " calls (agent.max_calls)")));
  }
  if (spec.max_episode_tokens() > 0 && e.tokens >= spec.max_episode_tokens()) {
    return refuse(absl::ResourceExhaustedError(
        absl::StrCat("episode ", e.episode_id, " spent its ", spec.max_episode_tokens(),
                     " tokens (agent.max_episode_tokens)")));
  }
  call->index = e.calls++;
  e.call = std::move(call);
  RenderCall(g, a.sample);
}

void EpisodeEngine::OnRendered(Group& g, Answer& a) {
  AgentEpisode& e = g.agents[a.sample];
  if (e.call == nullptr || e.call != a.call) return;  // answered meanwhile (the group ended)
  AgentCall& c = *e.call;
  const auto refuse = [&](const absl::Status& why) {
    --e.calls;  // a refused call is not one of the episode's
    AnswerCall(e, why);
  };
  if (!a.status.ok()) return refuse(a.status);
  const v1::AgentSpec& spec = *g.request.agent;
  const CallPrompt& start = c.start;
  std::vector<int32_t> added = start.tokens;
  added.insert(added.end(), c.opening_tokens.begin(), c.opening_tokens.end());
  const int64_t n_added = static_cast<int64_t>(added.size());
  const bool continues = start.continues && e.request_id != 0;
  const int64_t sequence = (continues ? e.sequence_tokens : 0) + n_added;
  const int64_t room = engine_->max_sequence_tokens() - sequence;
  if (room < 1) {
    return refuse(absl::InvalidArgumentError(absl::StrCat(
        "messages: the conversation is ", sequence, " tokens, which leaves no room for an answer ",
        "in the model's context of ", engine_->max_sequence_tokens(),
        " tokens (context_length_exceeded)")));
  }
  int64_t budget = spec.max_tokens_per_call();
  if (c.call.max_tokens > 0) budget = std::min<int64_t>(budget, c.call.max_tokens);
  if (spec.max_episode_tokens() > 0) {
    const int64_t left = spec.max_episode_tokens() - e.tokens - (continues ? n_added : 0);
    if (left < 1) {
      return refuse(absl::ResourceExhaustedError(
          absl::StrCat("episode ", e.episode_id, ": the call's ", n_added,
                       " new tokens leave nothing of the episode's ", spec.max_episode_tokens(),
                       " (agent.max_episode_tokens)")));
    }
    budget = std::min(budget, left);
  }
  budget = std::min(budget, room);
  // The call's own sampling, else the prompt set's.
  const SamplingParams& set = g.request.params;
  TurnSampling sampling;
  sampling.temperature = c.call.temperature.value_or(set.temperature);
  sampling.top_p = c.call.top_p.value_or(set.top_p);
  sampling.top_logprobs = c.call.logprobs ? c.call.top_logprobs : 0;
  const uint64_t seed = c.call.seed.value_or(set.seed);
  if (!c.call.stop.empty()) c.stops = std::make_shared<StopStrings>(codec_, c.call.stop);
  *e.live = e.call;
  if (continues) {
    sampling.seed = MixSeed(seed, a.sample, e.segments_started - 1);
    const absl::Status going =
        engine_->Continue(e.request_id, 0, added, static_cast<int32_t>(budget), sampling);
    if (!going.ok()) {
      *e.live = nullptr;
      return refuse(absl::InvalidArgumentError(absl::StrCat("messages: ", going.message())));
    }
    c.context_tokens = e.sequence_tokens + static_cast<int64_t>(start.tokens.size());
    e.sequence_tokens += n_added;
    e.tokens += n_added;
    return;
  }
  // A new trajectory: the open one (if any) is finished as a record of its own.
  if (e.request_id != 0) {
    if (options_.metrics != nullptr) options_.metrics->agent_splits.Increment();
    std::fprintf(stderr, "episodes: episode %s starts trajectory %d: %s\n", e.episode_id.c_str(),
                 e.segments_started + 1, start.split.c_str());
    const absl::Status closed = engine_->FinishSample(e.request_id, 0);
    if (!closed.ok()) {
      return Fail(g, absl::Status(closed.code(),
                                  absl::StrCat("episode ", e.episode_id, ": ", closed.message())));
    }
    e.closing[e.request_id] = {std::move(e.call_ends), std::move(e.call_numbers)};
    e.call_ends.clear();
    e.call_numbers.clear();
    e.request_id = 0;
  }
  SamplingParams params = set;
  params.n = 1;
  params.multi_turn = true;
  params.max_tokens = static_cast<int32_t>(budget);
  params.temperature = sampling.temperature;
  params.top_p = sampling.top_p;
  params.top_logprobs = sampling.top_logprobs;
  params.seed = MixSeed(seed, a.sample, e.segments_started);
  // A forced tool call's opening: context after the prompt (source 1), as between calls.
  params.context_after_prompt = c.opening_tokens;
  params.end_turn = [live = e.live, codec = codec_,
                     format = g.tool_format](absl::Span<const int32_t> turn) {
    const std::shared_ptr<AgentCall>& call = *live;
    return call != nullptr && call->EndsTurn(*codec, format, turn);
  };
  absl::StatusOr<uint64_t> id = engine_->AddRequest(start.tokens, params, g.request.adapter);
  if (!id.ok()) {
    *e.live = nullptr;
    return refuse(absl::InvalidArgumentError(absl::StrCat("messages: ", id.status().message())));
  }
  e.request_id = *id;
  by_request_[*id] = {g.request.id, a.sample};
  e.prompt_tokens = static_cast<int64_t>(start.tokens.size());
  e.sequence_tokens = n_added;
  ++e.segments_started;
  c.context_tokens = static_cast<int64_t>(start.tokens.size());
}

void EpisodeEngine::OnAnswered(Group& g, Answer& a) {
  AgentEpisode& e = g.agents[a.sample];
  if (e.call == nullptr || e.call != a.call) return;
  e.open = std::move(a.trajectory);
  if (options_.metrics != nullptr) {
    options_.metrics->agent_call_latency_seconds.Observe(
        absl::ToDoubleSeconds(absl::Now() - e.call->arrived));
  }
  e.call.reset();
}

void EpisodeEngine::OnReturned(Group& g, Answer& a) {
  AgentEpisode& e = g.agents[a.sample];
  const std::string agent = absl::StrCat("agent at ", g.request.agent->address(),
                                         ": RunEpisode of episode '", e.episode_id, "'");
  if (!a.status.ok()) return Fail(g, a.status);  // (its message names the agent and episode)
  if (e.call != nullptr) {
    return Fail(g, absl::FailedPreconditionError(absl::StrCat(
                       agent, " returned while its call ", e.call->index + 1,
                       " was still generating: nothing half-finished is trained")));
  }
  if (e.calls == 0) {
    return Fail(g, absl::FailedPreconditionError(absl::StrCat(
                       agent, " returned without calling the endpoint (",
                       base_url_, "): the episode has nothing to train")));
  }
  if (absl::Status valid = env::ValidateRunEpisodeResponse(a.returned, e.calls); !valid.ok()) {
    return Fail(g, absl::InvalidArgumentError(absl::StrCat(agent, ": ", valid.message())));
  }
  e.returned = true;
  e.result = std::move(a.returned);
  gateway_->Revoke(e.key);
  if (e.request_id != 0) {
    const absl::Status closed = engine_->FinishSample(e.request_id, 0);
    if (!closed.ok()) {
      return Fail(g, absl::Status(closed.code(),
                                  absl::StrCat("episode ", e.episode_id, ": ", closed.message())));
    }
    e.closing[e.request_id] = {std::move(e.call_ends), std::move(e.call_numbers)};
    e.request_id = 0;
  }
  FinishAgentsIfDone(g);
}

void EpisodeEngine::OnSegment(Group& g, int32_t sample, RequestOutput output) {
  AgentEpisode& e = g.agents[sample];
  auto closing = e.closing.find(output.request_id);
  if (closing == e.closing.end() || output.samples.size() != 1) return;
  EpisodeSegment& s = e.segments[output.request_id];
  s.prompt = std::move(output.prompt);
  s.output = std::move(output.samples[0]);
  s.output.sample_index = sample;
  s.turn_ends = std::move(closing->second.ends);
  e.segment_calls[output.request_id] = std::move(closing->second.numbers);
  e.closing.erase(closing);
  FinishAgentsIfDone(g);
}

void EpisodeEngine::FinishAgentsIfDone(Group& g) {
  for (const AgentEpisode& e : g.agents) {
    if (!e.returned || !e.closing.empty() || e.request_id != 0) return;
  }
  FinishedGroup done{g.request.id, RequestOutput(), {}};
  for (AgentEpisode& e : g.agents) {
    EpisodeOutcome o;
    o.reward = e.result.reward();
    o.reason = e.result.done_reason();
    for (auto& [id, s] : e.segments) {
      for (int32_t number : e.segment_calls[id]) {  // the agent's reward of each call, if given
        s.turn_rewards.push_back(
            e.result.call_rewards_size() > number ? e.result.call_rewards(number) : 0.0);
      }
      o.segments.push_back(std::move(s));
    }
    o.turn_ends = o.segments.back().turn_ends;
    o.turn_rewards = o.segments.back().turn_rewards;
    done.output.samples.push_back(o.segments.back().output);
    if (options_.metrics != nullptr) {
      options_.metrics->agent_calls_per_episode.Observe(static_cast<double>(e.calls));
    }
    done.episodes.push_back(std::move(o));
  }
  done.output.prompt = done.episodes[0].segments.back().prompt;
  finished_.push_back(std::move(done));
  groups_.erase(g.request.id);  // g is gone
}

void EpisodeEngine::AnswerCall(AgentEpisode& e, absl::StatusOr<openai::Completion> answer) {
  if (e.call == nullptr) return;
  if (!answer.ok() && options_.metrics != nullptr) {
    options_.metrics->AgentCallErrors(answer.status().code()).Increment();
  }
  if (e.call->Claim()) e.call->done(std::move(answer));
  e.call.reset();
  if (e.live != nullptr) *e.live = nullptr;
}

void EpisodeEngine::EndAgents(Group& g, const absl::Status& why) {
  // Every episode marked before any RunEpisode is cancelled: a cancelled one frees its
  // address's thread, which must find the group's queued ones already ended.
  for (AgentEpisode& e : g.agents) e.ended->store(true);
  for (AgentEpisode& e : g.agents) {
    if (gateway_ != nullptr) gateway_->Revoke(e.key);
    if (!e.returned && g.agent != nullptr) g.agent->client->Cancel(e.episode_id);
    AnswerCall(e, absl::UnauthenticatedError(
                      absl::StrCat("episode ", e.episode_id, " has ended: ", why.message())));
  }
}

}  // namespace prl::episode
