// AgentGateway: what the actor's OpenAI-compatible endpoint (openai/openai_server.h) sees of the
// episode engine — the agents' per-episode keys, and a way to hand a call to the engine loop.
//
// Keys (docs/agents.md, "Security"): "prl-ep-" and 64 hex digits of 32 bytes from the operating
// system's random source (OpenSSL RAND_bytes), one per agent episode, issued when its RunEpisode
// goes out and revoked when the episode ends (returned, failed, aborted, the actor stopping).
// A key is a capability for its episode only: it generates for that episode and nothing else;
// it is never a role's token, and never logged. The table holds the keys' SHA-256 digests, not
// the keys, so that a lookup's timing tells nothing of a key.
//
// Thread-safety: every method may be called from any thread; `post` is called on the endpoint's
// thread and must only queue the call.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>

#include "openai/openai_server.h"

namespace prl::episode {

// The agent episode a key belongs to.
struct EpisodeRef {
  std::string group;    // the group's id
  int32_t attempt = 0;  // the group's attempt (restarts give new keys)
  int32_t sample = 0;
};

class AgentGateway final : public openai::CompletionBackend {
 public:
  using Post = std::function<void(const EpisodeRef& episode, openai::ChatCall call,
                                  Progress progress, Done done)>;
  AgentGateway(std::string model, Post post) : model_(std::move(model)), post_(std::move(post)) {}

  // A new key for `episode`.
  std::string Issue(const EpisodeRef& episode);
  // The key stops working (its calls in flight are the engine's to end).
  void Revoke(const std::string& key);
  int64_t keys() const;

  std::string model() const override { return model_; }
  bool KnowsKey(const std::string& key) const override;
  // An unknown key's call is Unauthenticated; a known one's goes to the engine loop.
  void Generate(const std::string& key, openai::ChatCall call, Progress progress,
                Done done) override;

 private:
  const std::string model_;
  const Post post_;
  mutable std::mutex mu_;
  std::map<std::string, EpisodeRef> by_digest_;  // SHA-256 of the key (raw bytes) -> episode
};

}  // namespace prl::episode
