// The episode engine's environment calls (declared in episode/episode_engine.h): each runs on
// its environment's own threads, renders what the engine needs (the first prompt, a reply as a
// delta, a turn's tool calls) and leaves an Answer in the inbox for the engine loop.
#include "absl/strings/str_cat.h"
#include "episode/episode_engine.h"
#include "episode/episode_engine_internal.h"
#include "episode/episode_protocol.h"
#include "episode/turn_renderer.h"

namespace prl::episode {

namespace v1 = prl::v1;
using internal::Timed;

// ---- Calls ----------------------------------------------------------------------------------

void EpisodeEngine::CallStart(Group& g, int32_t sample) {
  v1::StartEpisodeRequest request =
      StartRequestOf(g.request, sample, g.samples[sample].episode_id, *codec_);
  g.endpoint->Post([inbox = inbox_.get(), metrics = options_.metrics, endpoint = g.endpoint,
                    client = g.client, codec = codec_, chat = g.chat, group = g.request.id,
                    attempt = g.attempt, sample, submitted = g.request.submitted,
                    prompt = g.request.prompt, request = std::move(request)] {
    Answer a = Answer::For(Answer::Kind::kStart, group, attempt, sample);
    absl::StatusOr<v1::StartEpisodeResponse> started =
        Timed(metrics, *endpoint, [&] { return client->StartEpisode(request); });
    // The environment's tools join the prompt's: the first prompt and every reply render them.
    absl::StatusOr<ChatContext> context =
        started.ok() ? WithTools(chat, started->tools_json()) : started.status();
    absl::StatusOr<std::vector<int32_t>> first =
        context.ok() ? FirstPromptOf(*codec, prompt, submitted, started->observation(), *context,
                                     !started->tools_json().empty())
                     : context.status();
    a.status = first.status();
    if (first.ok()) {
      a.tokens = *std::move(first);
      a.stop_strings.assign(started->stop_strings().begin(), started->stop_strings().end());
      a.chat = *std::move(context);
    }
    inbox->Put(std::move(a));
  });
}

void EpisodeEngine::CallStep(Group& g, TurnOutput turn) {
  Sample& s = g.samples[turn.sample_index];
  g.endpoint->Post([inbox = inbox_.get(), metrics = options_.metrics, endpoint = g.endpoint,
                    client = g.client, codec = codec_, chat = g.chat, group = g.request.id,
                    attempt = g.attempt, format = g.tool_format, episode_id = s.episode_id,
                    turn_index = s.turns, stops = g.request.params.stop_token_ids,
                    turn = std::move(turn)] {
    Answer a = Answer::For(Answer::Kind::kStep, group, attempt, turn.sample_index);
    a.turn_tokens = static_cast<int64_t>(turn.tokens.size());
    absl::StatusOr<v1::StepRequest> request =
        StepRequestOf(episode_id, turn_index, turn, *codec, stops, format);
    a.status = request.status();
    if (request.ok()) {
      const v1::StepRequest& r = *request;
      absl::StatusOr<v1::StepResponse> answer =
          Timed(metrics, *endpoint, [&] { return client->Step(r); });
      a.status = answer.status();
      if (answer.ok() && !answer->done()) {
        absl::StatusOr<std::vector<int32_t>> reply = RenderReply(
            *codec, answer->messages(), turn.tokens.empty() ? -1 : turn.tokens.back(), chat);
        a.status = reply.status();
        if (reply.ok()) a.tokens = *std::move(reply);
      }
      if (answer.ok()) a.step = *std::move(answer);
    }
    inbox->Put(std::move(a));
  });
}

void EpisodeEngine::CallEnd(Group& g, int32_t sample, const std::string& reason) {
  v1::EndEpisodeRequest request;
  request.set_episode_id(g.samples[sample].episode_id);
  request.set_truncated(true);
  request.set_reason(reason);
  g.endpoint->Post([inbox = inbox_.get(), metrics = options_.metrics, endpoint = g.endpoint,
                    client = g.client, group = g.request.id, attempt = g.attempt, sample,
                    request = std::move(request)] {
    Answer a = Answer::For(Answer::Kind::kEnd, group, attempt, sample);
    a.reason = request.reason();
    absl::StatusOr<v1::EndEpisodeResponse> ended =
        Timed(metrics, *endpoint, [&] { return client->EndEpisode(request); });
    a.status = ended.status();
    if (ended.ok()) a.reward = ended->episode_reward();
    inbox->Put(std::move(a));
  });
}

void EpisodeEngine::NotifyAborted(const Group& g, const std::string& reason) {
  for (const Sample& s : g.samples) {
    if (s.episode_id.empty() || s.ended) continue;
    v1::EndEpisodeRequest request;
    request.set_episode_id(s.episode_id);
    request.set_aborted(true);
    request.set_reason(absl::StrCat("aborted: ", reason.substr(0, 256)));
    // Fire and forget: the answer (and an error: the episode may be unknown there) is not used.
    g.endpoint->Post([client = g.client, request = std::move(request)] {
      client->EndEpisode(request).IgnoreError();
    });
  }
}

}  // namespace prl::episode
