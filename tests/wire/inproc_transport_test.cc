// The in-process transport: simulated clients (EchoPeer) on a two-thread pool. Checks OnStart
// delivery, per-peer ordering and mutual exclusion (the strand), that a failing peer stops, peer
// addressing, and that Receive honours its timeout.
#include "transport/inproc_transport.h"

#include <atomic>
#include <chrono>
#include <map>
#include <numeric>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "proto/codec.h"
#include "tests/wire/wire_testing.h"

namespace huddle::transport {
namespace {

using Clock = std::chrono::steady_clock;
using wire::Message;
using wire::testutil::IsError;

constexpr auto kDeadline = std::chrono::seconds(5);

// Joins on start and answers every message with a Heartbeat carrying the message's round. Records
// what it saw; flags calls that overlap (the strand forbids them) or come after it failed.
class EchoPeer : public InProcPeer {
 public:
  explicit EchoPeer(std::string id, std::optional<uint64_t> fail_at_round = std::nullopt)
      : id_(std::move(id)), fail_at_round_(fail_at_round) {}

  std::vector<Message> OnStart() override {
    std::vector<Message> out;
    out.push_back(wire::MakeMessage(wire::Join{id_, 1, "test"}, 0, id_));
    return out;
  }

  StatusOr<std::vector<Message>> OnMessage(const Message& msg) override {
    if (busy_.exchange(true)) overlapping_calls_++;
    if (failed_) calls_after_failure_++;
    rounds_seen_.push_back(msg.round);
    for (const wire::TensorPayload& t : msg.tensors) payloads_seen_.push_back(t.bytes.data());
    // Widen the window in which an overlapping call would be caught.
    if (msg.round % 16 == 0) std::this_thread::yield();
    busy_ = false;
    if (fail_at_round_ == msg.round) {
      failed_ = true;
      return absl::InternalError(absl::StrCat(id_, " fails on round ", msg.round));
    }
    std::vector<Message> out;
    out.push_back(wire::MakeMessage(wire::Heartbeat{}, msg.round, id_));
    return out;
  }

  // Read only after the transport is idle for this peer (its replies were received).
  const std::vector<uint64_t>& rounds_seen() const { return rounds_seen_; }
  const std::vector<const std::byte*>& payloads_seen() const { return payloads_seen_; }
  int overlapping_calls() const { return overlapping_calls_; }
  int calls_after_failure() const { return calls_after_failure_; }

 private:
  const std::string id_;
  const std::optional<uint64_t> fail_at_round_;
  std::atomic<bool> busy_{false};
  std::atomic<int> overlapping_calls_{0};
  std::atomic<int> calls_after_failure_{0};
  std::atomic<bool> failed_{false};
  std::vector<uint64_t> rounds_seen_;
  std::vector<const std::byte*> payloads_seen_;
};

class InProcTransportTest : public ::testing::Test {
 protected:
  static constexpr int kPeers = 50;
  static constexpr int kThreads = 2;

  // kPeers echo peers ("client-<i>"), peer `failing` (if any) failing at `fail_at_round`.
  void MakeServer(int failing = -1, uint64_t fail_at_round = 0) {
    std::vector<InProcPeer*> raw;
    for (int i = 0; i < kPeers; ++i) {
      peers_.push_back(std::make_unique<EchoPeer>(
          "client-" + std::to_string(i),
          i == failing ? std::optional<uint64_t>(fail_at_round) : std::nullopt));
      raw.push_back(peers_.back().get());
    }
    server_ = std::make_unique<InProcServerTransport>(raw, kThreads);
  }

  // Starts the simulation and consumes every peer's Join.
  void StartAndDrainJoins() {
    server_->Start();
    ASSERT_EQ(ReceiveAll(kPeers).size(), static_cast<size_t>(kPeers));
  }

  // Exactly `n` inbound messages (fewer if the deadline passes first).
  std::vector<Inbound> ReceiveAll(size_t n) {
    std::vector<Inbound> out;
    for (const auto end = Clock::now() + kDeadline; out.size() < n && Clock::now() < end;) {
      StatusOr<std::optional<Inbound>> r = server_->Receive(50);
      EXPECT_TRUE(r.ok()) << r.status();
      if (r.ok() && r->has_value()) out.push_back(std::move(**r));
    }
    return out;
  }

  void SendHeartbeat(const PeerId& peer, uint64_t round) {
    ASSERT_TRUE(server_->Send(peer, wire::MakeMessage(wire::Heartbeat{}, round)).ok())
        << "peer " << peer << " round " << round;
  }

  std::vector<std::unique_ptr<EchoPeer>> peers_;  // outlive server_
  std::unique_ptr<InProcServerTransport> server_;
};

TEST_F(InProcTransportTest, StartDeliversEveryPeersJoinOnce) {
  MakeServer();
  server_->Start();
  std::vector<Inbound> joins = ReceiveAll(kPeers);
  ASSERT_EQ(joins.size(), static_cast<size_t>(kPeers));
  std::map<PeerId, std::string> client_of;
  for (const Inbound& in : joins) {
    ASSERT_TRUE(in.message.ok()) << in.message.status();
    ASSERT_EQ(in.message->type(), wire::MessageType::kJoin);
    EXPECT_TRUE(client_of.emplace(in.peer, std::get<wire::Join>(in.message->body).client_id).second)
        << "peer " << in.peer << " joined twice";
  }
  for (int i = 0; i < kPeers; ++i) {
    EXPECT_EQ(client_of[std::to_string(i)], "client-" + std::to_string(i))
        << "peers are addressed by their index";
  }
  auto extra = server_->Receive(0);
  ASSERT_TRUE(extra.ok());
  EXPECT_FALSE(extra->has_value());
}

TEST_F(InProcTransportTest, EachPeerHandlesItsMessagesOneAtATimeInOrder) {
  MakeServer();
  StartAndDrainJoins();
  constexpr uint64_t kRounds = 100;
  for (uint64_t round = 0; round < kRounds; ++round) {
    for (int p = 0; p < kPeers; ++p) SendHeartbeat(std::to_string(p), round);
  }
  std::vector<Inbound> echoes = ReceiveAll(kRounds * kPeers);
  ASSERT_EQ(echoes.size(), kRounds * kPeers);
  std::map<PeerId, std::vector<uint64_t>> rounds_back;
  for (const Inbound& in : echoes) {
    ASSERT_TRUE(in.message.ok());
    rounds_back[in.peer].push_back(in.message->round);
  }
  std::vector<uint64_t> in_order(kRounds);
  std::iota(in_order.begin(), in_order.end(), 0);
  for (int p = 0; p < kPeers; ++p) {
    SCOPED_TRACE("peer " + std::to_string(p));
    EXPECT_EQ(peers_[p]->rounds_seen(), in_order);
    EXPECT_EQ(rounds_back[std::to_string(p)], in_order);
    EXPECT_EQ(peers_[p]->overlapping_calls(), 0);
  }
}

TEST_F(InProcTransportTest, APeerThatFailsStopsReceiving) {
  MakeServer(/*failing=*/3, /*fail_at_round=*/5);
  StartAndDrainJoins();
  for (uint64_t round = 0; round < 10; ++round) {
    SendHeartbeat("3", round);
    SendHeartbeat("4", round);
  }
  std::vector<Inbound> echoes = ReceiveAll(15);
  std::map<PeerId, int> echoes_from;
  for (const Inbound& in : echoes) echoes_from[in.peer]++;
  EXPECT_EQ(echoes_from["3"], 5) << "rounds 0..4, then it failed";
  EXPECT_EQ(echoes_from["4"], 10);

  Status st = absl::OkStatus();
  for (const auto end = Clock::now() + kDeadline; st.ok() && Clock::now() < end;) {
    st = server_->Send("3", wire::MakeMessage(wire::Heartbeat{}, 99));
    if (st.ok()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_TRUE(IsError(st, absl::StatusCode::kNotFound, "simulated client 3 stopped"));
  EXPECT_EQ(peers_[3]->calls_after_failure(), 0);
  EXPECT_EQ(peers_[3]->rounds_seen(), (std::vector<uint64_t>{0, 1, 2, 3, 4, 5}));
  // The others carry on.
  SendHeartbeat("4", 10);
  ASSERT_EQ(ReceiveAll(1).size(), 1u);
}

TEST_F(InProcTransportTest, UnknownPeersAreNotFound) {
  MakeServer();
  StartAndDrainJoins();
  for (const char* peer : {"50", "-1", "", "abc", "7x", "18446744073709551616"}) {
    EXPECT_TRUE(IsError(server_->Send(peer, wire::testutil::SampleHeartbeat()),
                        absl::StatusCode::kNotFound, "no simulated client"))
        << "peer '" << peer << "'";
  }
}

TEST_F(InProcTransportTest, PeerIdsMatchOnlyTheirExactDecimalForm) {
  // The transport hands out "7"; "07", " 7" and "+7" are ids it never issued.
  MakeServer();
  StartAndDrainJoins();
  for (const char* alias : {"07", " 7", "+7", "7 "}) {
    EXPECT_EQ(server_->Send(alias, wire::testutil::SampleHeartbeat()).code(),
              absl::StatusCode::kNotFound)
        << "'" << alias << "' reached peer 7";
  }
}

TEST_F(InProcTransportTest, PayloadsAreSharedNotCopied) {
  MakeServer();
  StartAndDrainJoins();
  const Message fit = wire::testutil::SampleFitInstruction();
  const uint64_t out_before = server_->bytes_out();
  ASSERT_TRUE(server_->Send("0", fit).ok());
  std::vector<Inbound> echo = ReceiveAll(1);
  ASSERT_EQ(echo.size(), 1u);
  ASSERT_EQ(peers_[0]->payloads_seen().size(), fit.tensors.size());
  for (size_t i = 0; i < fit.tensors.size(); ++i) {
    EXPECT_EQ(peers_[0]->payloads_seen()[i], fit.tensors[i].bytes.data()) << "tensor " << i;
  }
  EXPECT_GE(server_->bytes_out() - out_before, fit.PayloadBytes());
  EXPECT_GT(echo[0].wire_bytes, 0u);
}

// A tensor larger than one wire chunk (the quickstart MLP's fc0.weight is 392 KiB) goes through the
// codec in chunks, as on the wire, and arrives whole: simulations with such models used to fail
// every send ("frame 1 of 2 has 401408 bytes") and ran with zero updates.
TEST_F(InProcTransportTest, TensorsLargerThanOneChunkArriveWhole) {
  MakeServer();
  StartAndDrainJoins();
  Message fit = wire::testutil::SampleFitInstruction();
  Tensor big("fc0.weight", {128, 784});
  for (size_t i = 0; i < big.data.size(); ++i) big.data[i] = static_cast<float>(i);
  ASSERT_GT(big.data.size() * sizeof(float), wire::kMaxChunkBytes);
  fit.tensors = {wire::TensorPayload::CopyOf(big)};
  ASSERT_TRUE(server_->Send("0", fit).ok());
  std::vector<Inbound> echo = ReceiveAll(1);
  ASSERT_EQ(echo.size(), 1u);
  ASSERT_TRUE(echo[0].message.ok()) << echo[0].message.status();
  ASSERT_EQ(peers_[0]->payloads_seen().size(), 1u);
}

TEST_F(InProcTransportTest, ByteCountersAddUpTheInbounds) {
  MakeServer();
  server_->Start();
  std::vector<Inbound> joins = ReceiveAll(kPeers);
  uint64_t total = 0;
  for (const Inbound& in : joins) total += in.wire_bytes;
  EXPECT_GT(total, 0u);
  EXPECT_EQ(server_->bytes_in(), total);
  EXPECT_EQ(server_->bytes_out(), 0u);
}

TEST_F(InProcTransportTest, ReceiveTimesOutPromptly) {
  MakeServer();  // not started: nothing will ever arrive
  auto start = Clock::now();
  auto r = server_->Receive(50);
  auto waited = Clock::now() - start;
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->has_value());
  EXPECT_GE(waited, std::chrono::milliseconds(45));
  EXPECT_LT(waited, std::chrono::milliseconds(1000));

  start = Clock::now();
  r = server_->Receive(0);
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->has_value());
  r = server_->Receive(-5);
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->has_value());
  EXPECT_LT(Clock::now() - start, std::chrono::milliseconds(200));
}

}  // namespace
}  // namespace huddle::transport
