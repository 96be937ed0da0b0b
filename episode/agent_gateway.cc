#include "episode/agent_gateway.h"

#include <openssl/rand.h>
#include <openssl/sha.h>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "core/check.h"

namespace prl::episode {

namespace {

std::string Digest(const std::string& key) {
  unsigned char digest[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(key.data()), key.size(), digest);
  return std::string(reinterpret_cast<const char*>(digest), sizeof(digest));
}

}  // namespace

std::string AgentGateway::Issue(const EpisodeRef& episode) {
  unsigned char bytes[32];
  PRL_CHECK(RAND_bytes(bytes, sizeof(bytes)) == 1, "the OS random source failed (RAND_bytes)");
  const std::string key = absl::StrCat(
      "prl-ep-", absl::BytesToHexString(absl::string_view(reinterpret_cast<char*>(bytes), 32)));
  std::lock_guard<std::mutex> lock(mu_);
  by_digest_[Digest(key)] = episode;
  return key;
}

void AgentGateway::Revoke(const std::string& key) {
  if (key.empty()) return;
  std::lock_guard<std::mutex> lock(mu_);
  by_digest_.erase(Digest(key));
}

int64_t AgentGateway::keys() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(by_digest_.size());
}

bool AgentGateway::KnowsKey(const std::string& key) const {
  const std::string digest = Digest(key);
  std::lock_guard<std::mutex> lock(mu_);
  return by_digest_.count(digest) > 0;
}

void AgentGateway::Generate(const std::string& key, openai::ChatCall call, Progress progress,
                            Done done) {
  const std::string digest = Digest(key);
  EpisodeRef episode;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = by_digest_.find(digest);
    if (it == by_digest_.end()) {
      done(absl::UnauthenticatedError("the key is unknown, or its episode has ended"));
      return;
    }
    episode = it->second;
  }
  post_(episode, std::move(call), std::move(progress), std::move(done));
}

}  // namespace prl::episode
