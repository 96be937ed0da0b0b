#include "openai/connection_table.h"

#include <tuple>
#include <utility>

namespace prl::openai {

template <class Fits>
std::map<uint64_t, ConnectionTable::Entry>::iterator ConnectionTable::Oldest(Fits fits) {
  auto oldest = entries_.end();
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    const Entry& e = it->second;
    if (e.shed_already || !e.waiting || !fits(e)) continue;
    if (oldest == entries_.end() || e.since < oldest->second.since) oldest = it;
  }
  return oldest;
}

void ConnectionTable::Shed(std::map<uint64_t, Entry>::iterator it) {
  it->second.shed_already = true;
  // The callback may close the connection at once; the entry stays until Remove.
  std::function<void()> shed = std::move(it->second.shed);
  if (shed) shed();
}

bool ConnectionTable::Admit(const std::string& peer) {
  std::map<std::string, int> unauthenticated;  // by peer
  for (const auto& [id, e] : entries_) {
    if (!e.shed_already && !e.authenticated && e.waiting) ++unauthenticated[e.peer];
  }
  if (max_unauthenticated_per_peer_ > 0 && unauthenticated[peer] >= max_unauthenticated_per_peer_) {
    const auto victim = Oldest([&](const Entry& e) { return !e.authenticated && e.peer == peer; });
    if (victim != entries_.end()) {
      --unauthenticated[peer];
      Shed(victim);
    }
  }
  if (open() < max_connections_) return true;
  std::string heaviest;  // the peer holding the most unauthenticated connections
  int most = 0;
  for (const auto& [p, n] : unauthenticated) {
    if (n > most) std::tie(heaviest, most) = std::tie(p, n);
  }
  auto victim = Oldest([&](const Entry& e) { return !e.authenticated && e.peer == heaviest; });
  if (victim == entries_.end()) victim = Oldest([](const Entry&) { return true; });
  if (victim == entries_.end()) return false;
  Shed(victim);
  return true;
}

uint64_t ConnectionTable::Add(const std::string& peer, std::function<void()> shed) {
  const uint64_t id = next_id_++;
  Entry& e = entries_[id];
  e.peer = peer;
  e.shed = std::move(shed);
  e.since = clock_++;
  return id;
}

void ConnectionTable::Remove(uint64_t id) { entries_.erase(id); }

void ConnectionTable::SetWaiting(uint64_t id, bool waiting) {
  const auto it = entries_.find(id);
  if (it == entries_.end() || it->second.waiting == waiting) return;
  it->second.waiting = waiting;
  if (waiting) it->second.since = clock_++;
}

void ConnectionTable::SetAuthenticated(uint64_t id) {
  const auto it = entries_.find(id);
  if (it != entries_.end()) it->second.authenticated = true;
}

int ConnectionTable::open() const {
  int n = 0;
  for (const auto& [id, e] : entries_) n += !e.shed_already;
  return n;
}

}  // namespace prl::openai
