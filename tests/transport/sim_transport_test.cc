// The simulated transport on its virtual clock: joins at time 0, the clock standing still but for
// Receive, delivery by virtual time (ties by send order) whatever the peers' real timing, a peer's
// serial busy time, the latency and bandwidth arithmetic, dropout drawn from the seed alone, a
// failing peer, and a whole exchange run twice giving the same deliveries at the same times.
#include "transport/sim_transport.h"

#include <chrono>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "common/rng.h"
#include "gtest/gtest.h"
#include "tests/wire/wire_testing.h"

namespace huddle::transport {
namespace {

using wire::Message;

// Joins on start and answers every message with a Heartbeat carrying the message's round, after
// sleeping a random real time (0-3 ms, from `timing_seed`): the thread timing varies, the virtual
// times must not. Fails (stops) on `fail_at_round`.
class SleepyPeer : public InProcPeer {
 public:
  SleepyPeer(std::string id, uint64_t timing_seed, std::optional<uint64_t> fail_at_round)
      : id_(std::move(id)), timing_(timing_seed), fail_at_round_(fail_at_round) {}

  std::vector<Message> OnStart() override {
    std::vector<Message> out;
    out.push_back(wire::MakeMessage(wire::Join{id_, 1, "test"}, 0, id_));
    return out;
  }

  StatusOr<std::vector<Message>> OnMessage(const Message& msg) override {
    std::this_thread::sleep_for(std::chrono::microseconds(timing_.UniformInt(3000)));
    handled_++;
    if (fail_at_round_ == msg.round) {
      return absl::InternalError(absl::StrCat(id_, " fails on round ", msg.round));
    }
    std::vector<Message> out;
    out.push_back(wire::MakeMessage(wire::Heartbeat{}, msg.round, id_));
    return out;
  }

  int handled() const { return handled_.load(); }

 private:
  const std::string id_;
  Rng timing_;
  const std::optional<uint64_t> fail_at_round_;
  std::atomic<int> handled_{0};
};

// One reply as the coordinator saw it: when (virtual microseconds), from whom, for which round.
struct Delivery {
  int64_t at_us;
  PeerId peer;
  uint64_t round;
  bool operator==(const Delivery&) const = default;
};

std::ostream& operator<<(std::ostream& os, const Delivery& d) {
  return os << "{" << d.at_us << " us, peer " << d.peer << ", round " << d.round << "}";
}

class SimTransportTest : public ::testing::Test {
 protected:
  // `peers` sleepy peers; peer `failing` (if any) fails at `fail_at_round`.
  void MakeServer(int peers, SimulatedTransportOptions options, uint64_t timing_seed = 1,
                  int failing = -1, uint64_t fail_at_round = 0) {
    server_.reset();
    peers_.clear();
    std::vector<InProcPeer*> raw;
    for (int i = 0; i < peers; ++i) {
      peers_.push_back(std::make_unique<SleepyPeer>(
          "client-" + std::to_string(i), DeriveSeed(timing_seed, i),
          i == failing ? std::optional<uint64_t>(fail_at_round) : std::nullopt));
      raw.push_back(peers_.back().get());
    }
    server_ = std::make_unique<SimulatedServerTransport>(raw, std::move(options));
  }

  // Starts the simulation and consumes every peer's Join (all at virtual time 0).
  void StartAndDrainJoins() {
    server_->Start();
    for (size_t i = 0; i < peers_.size(); ++i) {
      std::optional<Delivery> join = ReceiveOne(0);
      ASSERT_TRUE(join.has_value()) << "join " << i;
    }
  }

  void SendRound(int peer, uint64_t round) {
    ASSERT_TRUE(
        server_->Send(std::to_string(peer), wire::MakeMessage(wire::Heartbeat{}, round)).ok())
        << "peer " << peer << " round " << round;
  }

  // A training instruction for `round` carrying a model of `floats` values.
  static Message Fit(uint64_t round, int64_t floats = 16) {
    Message m = wire::testutil::SampleFitInstruction();
    m.round = round;
    m.tensors.clear();
    m.tensors.push_back(wire::testutil::Payload("w", {floats}));
    return m;
  }

  std::optional<Delivery> ReceiveOne(int64_t timeout_ms) {
    StatusOr<std::optional<Inbound>> r = server_->Receive(timeout_ms);
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok() || !r->has_value()) return std::nullopt;
    EXPECT_TRUE((*r)->message.ok()) << (*r)->message.status();
    if (!(*r)->message.ok()) return std::nullopt;
    return Delivery{Now(), (*r)->peer, (*r)->message->round};
  }

  // Every reply until none is due within `horizon_ms` of virtual time.
  std::vector<Delivery> ReceiveUntilQuiet(int64_t horizon_ms = 3'600'000) {
    std::vector<Delivery> out;
    while (std::optional<Delivery> d = ReceiveOne(horizon_ms)) out.push_back(*d);
    return out;
  }

  int64_t Now() const { return server_->clock()->NowUs(); }

  std::vector<std::unique_ptr<SleepyPeer>> peers_;  // outlive server_
  std::unique_ptr<SimulatedServerTransport> server_;
};

// compute(peer, msg) = seconds[peer] (any message).
SimulatedTransportOptions PerPeerCompute(std::vector<double> seconds) {
  SimulatedTransportOptions o;
  o.compute = [seconds](size_t peer, const Message&) { return seconds.at(peer); };
  return o;
}

TEST_F(SimTransportTest, JoinsArriveAtTimeZeroInPeerOrderAndTheClockIsVirtual) {
  MakeServer(12, SimulatedTransportOptions{});
  EXPECT_TRUE(server_->clock()->simulated());
  EXPECT_FALSE(SteadyClock::Get()->simulated());
  server_->Start();
  for (int i = 0; i < 12; ++i) {
    std::optional<Delivery> join = ReceiveOne(0);
    ASSERT_TRUE(join.has_value());
    EXPECT_EQ(*join, (Delivery{0, std::to_string(i), 0}));
  }
  EXPECT_FALSE(ReceiveOne(0).has_value());
  EXPECT_EQ(server_->clock()->NowMs(), 0);
  const int64_t wall = server_->clock()->WallMs();
  EXPECT_NEAR(static_cast<double>(wall), static_cast<double>(SteadyClock::Get()->WallMs()), 5000)
      << "WallMs is the real system clock";
}

TEST_F(SimTransportTest, NothingDueAdvancesTheClockByTheTimeoutAtOnce) {
  MakeServer(2, SimulatedTransportOptions{});
  StartAndDrainJoins();
  const auto real_start = std::chrono::steady_clock::now();
  EXPECT_FALSE(ReceiveOne(250).has_value());
  EXPECT_EQ(server_->clock()->NowMs(), 250);
  EXPECT_FALSE(ReceiveOne(60'000).has_value());
  EXPECT_EQ(server_->clock()->NowMs(), 60'250);
  EXPECT_FALSE(ReceiveOne(0).has_value());
  EXPECT_EQ(server_->clock()->NowMs(), 60'250);
  EXPECT_LT(std::chrono::steady_clock::now() - real_start, std::chrono::seconds(5))
      << "a virtual minute takes no real minute";
}

TEST_F(SimTransportTest, RepliesArriveByVirtualTimeWhateverTheRealTiming) {
  // Peer i computes (8 - i) s: the last peer sent to answers first, whichever thread is slower.
  constexpr int kPeers = 8;
  std::vector<double> seconds;
  for (int i = 0; i < kPeers; ++i) seconds.push_back(kPeers - i);
  for (uint64_t timing_seed : {1, 2, 3}) {
    MakeServer(kPeers, PerPeerCompute(seconds), timing_seed);
    StartAndDrainJoins();
    for (int i = 0; i < kPeers; ++i) SendRound(i, 1);
    std::vector<Delivery> expected;
    for (int i = kPeers - 1; i >= 0; --i) {
      expected.push_back({(kPeers - i) * int64_t{1'000'000}, std::to_string(i), 1});
    }
    EXPECT_EQ(ReceiveUntilQuiet(), expected) << "timing seed " << timing_seed;
  }
}

TEST_F(SimTransportTest, RepliesDueTogetherArriveInSendOrder) {
  MakeServer(6, PerPeerCompute(std::vector<double>(6, 2.0)), /*timing_seed=*/7);
  StartAndDrainJoins();
  const std::vector<int> order = {3, 1, 5, 0, 4, 2};
  for (int p : order) SendRound(p, 9);
  std::vector<Delivery> expected;
  for (int p : order) expected.push_back({2'000'000, std::to_string(p), 9});
  EXPECT_EQ(ReceiveUntilQuiet(), expected);
}

TEST_F(SimTransportTest, APeerWorksOnOneMessageAtATime) {
  MakeServer(2, PerPeerCompute({10.0, 5.0}));
  StartAndDrainJoins();
  SendRound(0, 1);  // 0 -> 10 s
  SendRound(0, 2);  // queued behind it: 10 -> 20 s
  SendRound(1, 1);  // another peer, in parallel: 0 -> 5 s
  std::optional<Delivery> first = ReceiveOne(60'000);
  std::optional<Delivery> second = ReceiveOne(60'000);
  ASSERT_TRUE(first && second);
  EXPECT_EQ(*first, (Delivery{5'000'000, "1", 1}));
  EXPECT_EQ(*second, (Delivery{10'000'000, "0", 1}));
  // Sent at 10 s to a peer busy until 20 s: it starts at 20 s.
  SendRound(0, 3);
  EXPECT_EQ(ReceiveUntilQuiet(),
            (std::vector<Delivery>{{20'000'000, "0", 2}, {30'000'000, "0", 3}}));
  EXPECT_EQ(peers_[0]->handled(), 3);
}

TEST_F(SimTransportTest, LatencyAndBandwidthAreAddedBothWays) {
  // 1 byte per microsecond; 50 ms each way; 2 s of compute for a training instruction.
  SimulatedTransportOptions o;
  o.latency_s = 0.05;
  o.bandwidth_bytes_per_s = 1e6;
  o.compute = [](size_t, const Message& m) {
    return m.type() == wire::MessageType::kFitInstruction ? 2.0 : 0.0;
  };
  MakeServer(1, o);
  StartAndDrainJoins();
  constexpr int64_t kModelFloats = 25'000;  // 100,000 bytes: 0.1 s on the link
  uint64_t out0 = server_->bytes_out();
  ASSERT_TRUE(server_->Send("0", Fit(1, kModelFloats)).ok());
  const int64_t fit_bytes = static_cast<int64_t>(server_->bytes_out() - out0);
  EXPECT_GT(fit_bytes, kModelFloats * 4) << "the header and the model";
  std::optional<Delivery> trained = ReceiveOne(60'000);
  ASSERT_TRUE(trained);
  // There (latency + the instruction's bytes), compute, back (latency; the reply is small).
  EXPECT_EQ(trained->at_us, 50'000 + fit_bytes + 2'000'000 + 50'000);

  // A grant's reply is the update: the model's bytes come back over the link.
  const int64_t granted_at = Now();
  out0 = server_->bytes_out();
  ASSERT_TRUE(server_->Send("0", wire::MakeMessage(wire::UploadGrant{}, 1)).ok());
  const int64_t grant_bytes = static_cast<int64_t>(server_->bytes_out() - out0);
  std::optional<Delivery> uploaded = ReceiveOne(60'000);
  ASSERT_TRUE(uploaded);
  EXPECT_EQ(uploaded->at_us - granted_at, 50'000 + grant_bytes + 50'000 + kModelFloats * 4);

  // bytes_in counts each reply as it is received.
  EXPECT_GT(server_->bytes_in(), 0u);
}

TEST_F(SimTransportTest, DropoutIsDrawnFromTheSeedPeerAndCountAlone) {
  constexpr int kPeers = 20, kRounds = 10;
  // The (peer, round) pairs answered, with random real timings.
  auto answered = [&](uint64_t seed, uint64_t timing_seed) {
    SimulatedTransportOptions o;
    o.dropout.assign(kPeers, 0.3);
    o.seed = seed;
    MakeServer(kPeers, o, timing_seed);
    StartAndDrainJoins();
    for (int r = 1; r <= kRounds; ++r) {
      for (int p = 0; p < kPeers; ++p) EXPECT_TRUE(server_->Send(std::to_string(p), Fit(r)).ok());
      for (int p = 0; p < kPeers; ++p) SendRound(p, 1000 + r);  // not training: never lost
    }
    std::set<std::pair<std::string, uint64_t>> got;
    for (const Delivery& d : ReceiveUntilQuiet()) got.emplace(d.peer, d.round);
    EXPECT_EQ(got.size() + server_->dropouts(), size_t{2 * kPeers * kRounds});
    for (int p = 0; p < kPeers; ++p) {
      for (int r = 1; r <= kRounds; ++r) {
        EXPECT_TRUE(got.count({std::to_string(p), 1000 + r})) << "heartbeats are never lost";
      }
    }
    return got;
  };
  const auto first = answered(42, 1);
  const uint64_t dropped = server_->dropouts();
  EXPECT_GT(dropped, 25u);  // ~60 of 200 expected
  EXPECT_LT(dropped, 95u);
  EXPECT_EQ(answered(42, 2), first) << "the same seed loses the same instructions";
  EXPECT_EQ(server_->dropouts(), dropped);
  EXPECT_NE(answered(43, 1), first) << "another seed, other losses";
}

TEST_F(SimTransportTest, AFailingPeerStopsAndIsGoneOnceItsFailureIsDue) {
  MakeServer(2, PerPeerCompute({1.0, 1.0}), /*timing_seed=*/1, /*failing=*/0,
             /*fail_at_round=*/2);
  StartAndDrainJoins();
  SendRound(0, 1);  // due at 1 s
  SendRound(0, 2);  // fails; due at 2 s
  SendRound(0, 3);  // never handled
  SendRound(1, 1);
  EXPECT_EQ(ReceiveUntilQuiet(10'000),
            (std::vector<Delivery>{{1'000'000, "0", 1}, {1'000'000, "1", 1}}));
  EXPECT_GE(Now(), 2'000'000);
  EXPECT_TRUE(absl::IsNotFound(server_->Send("0", wire::MakeMessage(wire::Heartbeat{}, 4))));
  EXPECT_TRUE(server_->Send("1", wire::MakeMessage(wire::Heartbeat{}, 4)).ok());
  EXPECT_EQ(peers_[0]->handled(), 2) << "nothing after the failure";
  EXPECT_TRUE(absl::IsNotFound(server_->Send("7", wire::MakeMessage(wire::Heartbeat{}, 1))));
}

// A coordinator-like exchange: each reply is answered with the peer's next round (and now and then
// a message to its neighbour), compute times vary by peer and round; the deliveries, their times
// and the bytes counted are the same whatever the threads do.
TEST_F(SimTransportTest, TheSameExchangeTwiceGivesTheSameDeliveries) {
  constexpr int kPeers = 10;
  constexpr uint64_t kRounds = 6;
  auto run = [&](uint64_t timing_seed) {
    SimulatedTransportOptions o;
    o.threads = 3;
    o.latency_s = 0.02;
    o.bandwidth_bytes_per_s = 5e5;
    o.dropout.assign(kPeers, 0.1);
    o.seed = 9;
    o.compute = [](size_t peer, const Message& m) {
      Rng rng(DeriveSeed(peer, m.round));
      return 0.5 + 10 * rng.Uniform();
    };
    MakeServer(kPeers, o, timing_seed);
    server_->Start();
    std::vector<Delivery> seen;
    std::vector<uint64_t> bytes;
    while (std::optional<Delivery> d = ReceiveOne(60'000)) {
      seen.push_back(*d);
      bytes.push_back(server_->bytes_in());
      const int p = std::stoi(d->peer);
      if (d->round < kRounds) {
        EXPECT_TRUE(server_->Send(d->peer, Fit(d->round + 1, 200)).ok());
      }
      if (d->round % 3 == 1) SendRound((p + 1) % kPeers, 100 + d->round);
    }
    // Quiet for a virtual minute: done (a lost instruction ends its peer's chain).
    return std::make_tuple(seen, bytes, server_->bytes_out(), server_->dropouts());
  };
  const auto first = run(1);
  EXPECT_GT(std::get<0>(first).size(), size_t{kPeers * 3});
  for (uint64_t timing_seed : {2, 3}) {
    const auto again = run(timing_seed);
    EXPECT_EQ(std::get<0>(again), std::get<0>(first)) << "timing seed " << timing_seed;
    EXPECT_EQ(std::get<1>(again), std::get<1>(first));
    EXPECT_EQ(std::get<2>(again), std::get<2>(first));
    EXPECT_EQ(std::get<3>(again), std::get<3>(first));
  }
}

}  // namespace
}  // namespace huddle::transport
