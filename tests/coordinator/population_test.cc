// The enrolled population (coordinator/population.h): joins, rejoins from another connection,
// removal on revocation, liveness.
#include "coordinator/population.h"

#include <gtest/gtest.h>

#include "tests/coordinator/fake_federation.h"

namespace huddle::coordinator {
namespace {

TEST(PopulationTest, AJoinMapsTheConnectionAndARejoinMovesIt) {
  testing::ManualClock clock;
  Population p(&clock, 0);
  Population::Joined first = p.Join("alice", "peer-1", 100, 1000);
  EXPECT_FALSE(first.rejoin);
  ASSERT_NE(p.IdOf("peer-1"), nullptr);
  EXPECT_EQ(*p.IdOf("peer-1"), "alice");

  clock.Advance(10);
  Population::Joined again = p.Join("alice", "peer-2", 120, 1000);
  EXPECT_TRUE(again.rejoin);
  EXPECT_EQ(again.old_peer, "peer-1");
  EXPECT_TRUE(again.old_peer_live) << "heard from 10 ms ago, within 1000 ms";
  EXPECT_EQ(p.IdOf("peer-1"), nullptr) << "the newest connection wins";
  ASSERT_NE(p.Find("alice"), nullptr);
  EXPECT_EQ(p.Find("alice")->peer, "peer-2");
  EXPECT_EQ(p.Find("alice")->num_examples, 120u);
  EXPECT_EQ(p.size(), 1u);

  clock.Advance(5000);
  EXPECT_FALSE(p.Join("alice", "peer-3", 120, 1000).old_peer_live);
  EXPECT_FALSE(p.Join("alice", "peer-3", 120, 1000).old_peer_live) << "the same connection";
}

TEST(PopulationTest, RemovalNeedsTheConnectionTheClientIsJoinedOn) {
  testing::ManualClock clock;
  Population p(&clock, 0);
  p.Join("alice", "peer-1", 100, 1000);
  p.Join("alice", "peer-2", 100, 1000);
  EXPECT_FALSE(p.Remove("alice", "peer-1")) << "an old connection's revocation";
  EXPECT_FALSE(p.Remove("bob", "peer-2"));
  EXPECT_TRUE(p.Remove("alice", "peer-2"));
  EXPECT_EQ(p.Find("alice"), nullptr);
  EXPECT_EQ(p.IdOf("peer-2"), nullptr);
  EXPECT_FALSE(p.Alive("alice")) << "a client that left is not live, and looking it up is safe";
  p.Heard("alice");  // no-op
  EXPECT_EQ(p.size(), 0u);
}

TEST(PopulationTest, ClientsAreLiveWhileHeardFromWithinTheTimeout) {
  testing::ManualClock clock;
  Population p(&clock, 1000);
  p.Join("carol", "c", 1, 0);
  p.Join("alice", "a", 1, 0);
  p.Join("bob", "b", 1, 0);
  clock.Advance(600);
  p.Heard("bob");
  clock.Advance(600);
  EXPECT_TRUE(p.Alive("bob"));
  EXPECT_FALSE(p.Alive("alice"));
  EXPECT_EQ(p.LiveCount(), 1);
  p.Heard("alice");
  EXPECT_EQ(p.LiveIds(), (std::vector<std::string>{"alice", "bob"})) << "sorted";
  EXPECT_EQ(p.LiveIds({"alice"}), (std::vector<std::string>{"bob"}));

  Population forever(&clock, 0);
  forever.Join("dave", "d", 1, 0);
  clock.Advance(1'000'000);
  EXPECT_TRUE(forever.Alive("dave")) << "client_timeout <= 0: always live";
}

}  // namespace
}  // namespace huddle::coordinator
