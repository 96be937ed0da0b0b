// openai/connection_table.h: Admit's rules one by one — a peer's unauthenticated connections
// bounded when a bound is set (its longest-waiting shed), the cap met by shedding a waiting
// connection (the heaviest peer's unauthenticated one before an idle authenticated one; a busy
// one never), and a refusal only when every connection is busy.
#include "openai/connection_table.h"

#include <gtest/gtest.h>

#include <deque>
#include <string>
#include <vector>

namespace prl::openai {
namespace {

class ConnectionTableTest : public ::testing::Test {
 protected:
  // Adds and records which id each shed callback belongs to.
  uint64_t AddNamed(ConnectionTable& t, const std::string& peer) {
    uint64_t* slot = &ids_.emplace_back(0);
    const uint64_t id = t.Add(peer, [this, slot] { shed_.push_back(*slot); });
    *slot = id;
    return id;
  }
  std::deque<uint64_t> ids_;
  std::vector<uint64_t> shed_;
};

TEST_F(ConnectionTableTest, APeerPastItsUnauthenticatedBoundLosesItsLongestWaiting) {
  ConnectionTable t(/*max_connections=*/100, /*max_unauthenticated_per_peer=*/2);
  const uint64_t a = AddNamed(t, "10.0.0.1");
  const uint64_t b = AddNamed(t, "10.0.0.1");
  AddNamed(t, "10.0.0.2");
  EXPECT_TRUE(t.Admit("10.0.0.1"));
  EXPECT_EQ(shed_, std::vector<uint64_t>{a});
  // Authenticated connections do not count toward the bound.
  t.SetAuthenticated(b);
  const uint64_t c = AddNamed(t, "10.0.0.1");
  EXPECT_TRUE(t.Admit("10.0.0.1"));
  EXPECT_EQ(shed_, std::vector<uint64_t>{a});
  EXPECT_EQ(t.open(), 3);  // b, c and 10.0.0.2's
  (void)c;
}

TEST_F(ConnectionTableTest, AtTheCapTheLongestWaitingIsShedUnauthenticatedFirstBusyNever) {
  ConnectionTable t(/*max_connections=*/3, /*max_unauthenticated_per_peer=*/100);
  const uint64_t idle = AddNamed(t, "p");
  const uint64_t busy = AddNamed(t, "p");
  const uint64_t fresh = AddNamed(t, "q");
  t.SetAuthenticated(idle);  // a keep-alive connection between two requests: waiting
  t.SetAuthenticated(busy);
  t.SetWaiting(busy, false);  // generating
  EXPECT_TRUE(t.Admit("r"));
  EXPECT_EQ(shed_, std::vector<uint64_t>{fresh}) << "unauthenticated before idle, though newer";
  AddNamed(t, "r");
  t.SetAuthenticated(ids_.back());
  t.SetWaiting(ids_.back(), false);
  EXPECT_TRUE(t.Admit("s"));
  EXPECT_EQ(shed_, (std::vector<uint64_t>{fresh, idle}));
  AddNamed(t, "s");
  t.SetAuthenticated(ids_.back());
  t.SetWaiting(ids_.back(), false);
  EXPECT_FALSE(t.Admit("t")) << "every connection busy: refused";
  EXPECT_EQ(shed_.size(), 2u);
  t.Remove(busy);
  EXPECT_TRUE(t.Admit("t"));
  EXPECT_EQ(t.listed(), 4);  // the shed ones stay listed until their sessions end
}

// At the cap, the unauthenticated connection shed is the longest-waiting one of the peer that
// holds the most: one host opening connections it never uses cannot crowd out another's.
TEST_F(ConnectionTableTest, AtTheCapThePeerHoldingTheMostUnauthenticatedLosesOne) {
  ConnectionTable t(/*max_connections=*/3, /*max_unauthenticated_per_peer=*/0);
  AddNamed(t, "agent-host");  // the oldest, but its peer holds one
  const uint64_t flood_1 = AddNamed(t, "flooder");
  AddNamed(t, "flooder");
  EXPECT_TRUE(t.Admit("agent-host"));
  EXPECT_EQ(shed_, std::vector<uint64_t>{flood_1});
  // Without a bound per peer, many unauthenticated connections of one peer are fine below the cap.
  ConnectionTable roomy(/*max_connections=*/100, /*max_unauthenticated_per_peer=*/0);
  for (int i = 0; i < 50; ++i) AddNamed(roomy, "agent-host");
  EXPECT_TRUE(roomy.Admit("agent-host"));
  EXPECT_EQ(shed_.size(), 1u);
}

TEST_F(ConnectionTableTest, WaitingAgainRestartsTheClock) {
  ConnectionTable t(/*max_connections=*/2, /*max_unauthenticated_per_peer=*/100);
  const uint64_t a = AddNamed(t, "p");
  const uint64_t b = AddNamed(t, "p");
  t.SetAuthenticated(a);
  t.SetAuthenticated(b);
  t.SetWaiting(a, false);
  t.SetWaiting(a, true);  // a answered a request: now it has waited less than b
  EXPECT_TRUE(t.Admit("q"));
  EXPECT_EQ(shed_, std::vector<uint64_t>{b});
}

}  // namespace
}  // namespace prl::openai
