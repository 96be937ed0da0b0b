// ConnectionTable: the OpenAI endpoint's open connections, and which ones a new connection
// sheds (openai/openai_server.h, "Before authentication"). Each connection is waiting (for its
// TLS handshake or its next request's head) or busy (reading an accepted request's body,
// generating, answering); it is unauthenticated until a request of its carried a key the backend
// knew. Admit's rules, in order:
//   1. with max_unauthenticated_per_peer > 0, a peer holds at most that many unauthenticated
//      connections: past it, its longest-waiting one is shed (0, the default: no bound of its
//      own, since agents on one host open many connections at once);
//   2. at most max_connections are open: past it, one waiting connection is shed — the
//      longest-waiting unauthenticated one of the peer holding the most unauthenticated
//      connections, else the longest-waiting idle authenticated one; a busy one never is;
//   3. when every connection is busy, the new one is refused (503).
// A shed connection is closed by its `shed` callback and no longer counted; it stays listed
// until Remove (its session's end).
//
// Thread-safety: none; the server's loop owns it.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>

namespace prl::openai {

class ConnectionTable {
 public:
  ConnectionTable(int max_connections, int max_unauthenticated_per_peer)
      : max_connections_(max_connections),
        max_unauthenticated_per_peer_(max_unauthenticated_per_peer) {}

  // Sheds what rules 1 and 2 say for a new connection from `peer`; false: refuse it (rule 3).
  bool Admit(const std::string& peer);
  // A connection in, waiting and unauthenticated; returns its id.
  uint64_t Add(const std::string& peer, std::function<void()> shed);
  void Remove(uint64_t id);
  void SetWaiting(uint64_t id, bool waiting);
  void SetAuthenticated(uint64_t id);

  int open() const;  // counted: listed and not shed
  int listed() const { return static_cast<int>(entries_.size()); }

 private:
  struct Entry {
    std::string peer;
    std::function<void()> shed;
    bool waiting = true, authenticated = false, shed_already = false;
    uint64_t since = 0;  // when it began waiting (a sequence number)
  };
  // The longest-waiting live connection matching `fits`, or none (entries_.end()).
  template <class Fits>
  std::map<uint64_t, Entry>::iterator Oldest(Fits fits);
  void Shed(std::map<uint64_t, Entry>::iterator it);

  int max_connections_, max_unauthenticated_per_peer_;
  std::map<uint64_t, Entry> entries_;
  uint64_t next_id_ = 1, clock_ = 0;
};

}  // namespace prl::openai
