// The server's per-connection bound (transport/connection_guard.h) looks again only at what may
// have changed since its last check (issue 34: an idle service with 1000 agents measured every
// connection 40 times a second). These tests hold it to its guarantees all the same:
//   - on plain TCP sockets, with this test in libzmq's place (it reads what the "peer" sends and
//     says what was delivered): idle connections cost no counter reads; a connection idle for many
//     checks that then floods is cut at its bound; an estimate over the bound that only reading
//     (no new bytes) makes real is caught, for one connection and for a key's group; a peer that
//     does not read what the server sends is still watched; a group of one key, and all
//     connections together, are bounded with their idle members counted; a lowered allowance cuts
//     an idle connection holding more than its new bound; and the allow-list is looked up again
//     only when it changed, then cutting an idle revoked connection;
//   - end to end on the ZeroMQ server, with a real CurveZMQ attacker (raw_curve_peer.h): a
//     connection idle for a second (forty checks) that then starts a never-ending message is cut
//     within its window, and revoking the key of an idle connection cuts it.
#include "transport/connection_guard.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "tests/testing/temp_dir.h"
#include "tests/wire/raw_curve_peer.h"
#include "tests/wire/zmq_peers.h"
#include "transport/curve_keys.h"
#include "transport/ports.h"
#include "transport/zmq_transport.h"

namespace huddle::transport {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
using std::chrono::seconds;

// Loopback TCP connections; the test plays libzmq on the server side of each.
class Sockets {
 public:
  Sockets() {
    listener_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    const int big = 1 << 20;  // room for what the tests leave unread (inherited by accepted fds)
    ::setsockopt(listener_, SOL_SOCKET, SO_RCVBUF, &big, sizeof(big));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    EXPECT_EQ(::bind(listener_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    EXPECT_EQ(::listen(listener_, 256), 0);
    EXPECT_EQ(::getsockname(listener_, reinterpret_cast<sockaddr*>(&addr), &len), 0);
    addr_ = addr;
  }
  ~Sockets() {
    for (int fd : fds_) ::close(fd);
    ::close(listener_);
  }
  Sockets(const Sockets&) = delete;
  Sockets& operator=(const Sockets&) = delete;

  struct Pair {
    int client = -1;
    int server = -1;
  };
  Pair Connect() {
    Pair p;
    p.client = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    EXPECT_EQ(::connect(p.client, reinterpret_cast<const sockaddr*>(&addr_), sizeof(addr_)), 0);
    p.server = ::accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC);
    EXPECT_GE(p.server, 0);
    fds_.push_back(p.client);
    fds_.push_back(p.server);
    return p;
  }

 private:
  int listener_ = -1;
  sockaddr_in addr_{};
  std::vector<int> fds_;
};

// What the server side of `fd` has queued, unread.
int Queued(int fd) {
  int queued = 0;
  ::ioctl(fd, SIOCINQ, &queued);
  return queued;
}

// Sends `n` bytes from p.client; the server side reads them (as libzmq would) when `read`, else
// they stay queued in its kernel buffer. Returns once they all arrived.
void Transfer(const Sockets::Pair& p, size_t n, bool read) {
  std::vector<char> buf(64 << 10, 'x');
  size_t sent = 0, got = 0;
  const int queued_before = Queued(p.server);
  for (auto end = Clock::now() + seconds(10); Clock::now() < end;) {
    if (sent < n) {
      const ssize_t s = ::send(p.client, buf.data(), std::min(buf.size(), n - sent), MSG_DONTWAIT);
      if (s > 0) sent += static_cast<size_t>(s);
    }
    if (read) {
      const ssize_t r = ::recv(p.server, buf.data(), buf.size(), MSG_DONTWAIT);
      if (r > 0) got += static_cast<size_t>(r);
      if (got == n) return;
    } else if (static_cast<size_t>(Queued(p.server) - queued_before) == n) {
      return;
    }
  }
  ADD_FAILURE() << "only " << sent << " of " << n << " bytes went through";
}

// Reads what the server side of p has queued (libzmq catching up, nothing new arriving).
void Drain(const Sockets::Pair& p) {
  std::vector<char> buf(64 << 10);
  while (::recv(p.server, buf.data(), buf.size(), MSG_DONTWAIT) > 0) {
  }
}

// Whether the peer of p.client shut the connection down (it reads end of file, or a reset).
bool WasCut(const Sockets::Pair& p) {
  pollfd pfd{p.client, POLLIN, 0};
  if (::poll(&pfd, 1, 1000) <= 0) return false;
  char c;
  return ::recv(p.client, &c, 1, MSG_DONTWAIT) <= 0;
}

class GuardTest : public ::testing::Test {
 protected:
  GuardTest() {
    options_.connection_window_bytes = 64 << 10;
    options_.unidentified_bytes_per_address = 1 << 20;
    options_.max_buffered_bytes = 64 << 20;
  }

  // One check; the allow-list admits every id but those in revoked_ids_.
  bool Check() {
    return guard_->Check(
        now_ms_ += 25, generation_,
        [&](const std::string& id, const std::string& /*key*/) {
          ++lookups_;
          return std::find(revoked_ids_.begin(), revoked_ids_.end(), id) == revoked_ids_.end();
        },
        &revoked_);
  }
  // A message of `bytes` on the wire delivered from p's connection, as peer `routing_id` (with
  // key `user_id` when set).
  void Deliver(const Sockets::Pair& p, const std::string& routing_id,
               const std::optional<std::string>& user_id, uint64_t bytes) {
    EXPECT_TRUE(guard_->OnDelivered(now_ms_, {p.server, routing_id, user_id, bytes}));
  }

  ZmqOptions options_;
  std::unique_ptr<ConnectionGuard> guard_;
  Sockets sockets_;
  int64_t now_ms_ = 0;
  uint64_t generation_ = 1;
  std::vector<std::string> revoked_ids_;
  std::vector<ConnectionGuard::Connection> revoked_;
  int lookups_ = 0;
};

TEST_F(GuardTest, IdleConnectionsCostNoCounterReads) {
  guard_ = std::make_unique<ConnectionGuard>(options_);
  std::vector<Sockets::Pair> pairs;
  for (int i = 0; i < 50; ++i) {
    pairs.push_back(sockets_.Connect());
    guard_->OnAccepted(pairs.back().server);
  }
  Check();
  EXPECT_EQ(guard_->measurements(), 50u);  // each new connection once
  for (int i = 0; i < 200; ++i) Check();
  EXPECT_EQ(guard_->measurements(), 50u) << "idle connections were measured";
  // Bytes arrive on two: those two are measured at the next check, once.
  Transfer(pairs[3], 1000, /*read=*/true);
  Transfer(pairs[40], 1000, /*read=*/false);
  Check();
  EXPECT_EQ(guard_->measurements(), 52u);
  for (int i = 0; i < 20; ++i) Check();
  EXPECT_EQ(guard_->measurements(), 52u);
  EXPECT_EQ(guard_->cut(), 0u);
}

TEST_F(GuardTest, AConnectionIdleForManyChecksThatFloodsIsCutAtItsBound) {
  guard_ = std::make_unique<ConnectionGuard>(options_);
  const Sockets::Pair idle = sockets_.Connect();
  const Sockets::Pair flood = sockets_.Connect();
  guard_->OnAccepted(idle.server);
  guard_->OnAccepted(flood.server);
  // Both join (a complete message each), then stay idle for a thousand checks.
  for (const Sockets::Pair& p : {idle, flood}) Transfer(p, 300, /*read=*/true);
  Deliver(idle, "peer-a", std::string("alice"), 300);
  Deliver(flood, "peer-m", std::string("mallory"), 300);
  for (int i = 0; i < 1000; ++i) ASSERT_FALSE(Check());
  // Then an unfinished message (never delivered) past the window, read by "libzmq".
  Transfer(flood, options_.connection_window_bytes + (16 << 10), /*read=*/true);
  EXPECT_TRUE(Check());
  EXPECT_EQ(guard_->cut(), 1u);
  EXPECT_TRUE(WasCut(flood));
  EXPECT_FALSE(WasCut(idle));
}

TEST_F(GuardTest, AnEstimateOverTheBoundIsRefinedUntilReadingMakesItReal) {
  guard_ = std::make_unique<ConnectionGuard>(options_);
  const Sockets::Pair p = sockets_.Connect();
  guard_->OnAccepted(p.server);
  Check();
  // Past the window, but still in the kernel's queue: libzmq holds none of it yet.
  Transfer(p, options_.connection_window_bytes + (16 << 10), /*read=*/false);
  for (int i = 0; i < 10; ++i) EXPECT_FALSE(Check());
  // libzmq reads it all; not one byte more arrives (no epoll event): the next check cuts.
  Drain(p);
  EXPECT_TRUE(Check());
  EXPECT_EQ(guard_->cut(), 1u);
}

// The one way an arrival raises no epoll event that is still there at the check: libzmq has read
// the bytes, and the socket is not writable either, because its peer does not read what the
// server sends (its send buffer full). Such a connection is measured at every check.
TEST_F(GuardTest, APeerThatDoesNotReadWhatTheServerSendsIsStillWatched) {
  guard_ = std::make_unique<ConnectionGuard>(options_);
  const Sockets::Pair p = sockets_.Connect();
  guard_->OnAccepted(p.server);
  Transfer(p, 100, /*read=*/true);
  Deliver(p, "peer", std::string("mallory"), 100);
  Check();
  // The server's sends fill the socket: the client never reads them.
  std::vector<char> chunk(64 << 10, 'y');
  for (int round = 0; round < 3; ++round) {
    while (::send(p.server, chunk.data(), chunk.size(), MSG_DONTWAIT) > 0) {
    }
    std::this_thread::sleep_for(milliseconds(20));
  }
  pollfd pfd{p.server, POLLOUT, 0};
  ASSERT_EQ(::poll(&pfd, 1, 0), 0) << "the server's socket is still writable";
  for (int i = 0; i < 10; ++i) ASSERT_FALSE(Check());
  // Then an unfinished message past the window, read at once by "libzmq".
  Transfer(p, options_.connection_window_bytes + (16 << 10), /*read=*/true);
  EXPECT_TRUE(Check());
  EXPECT_EQ(guard_->cut(), 1u);
}

TEST_F(GuardTest, OneKeysConnectionsAreBoundedTogetherIdleOnesIncluded) {
  guard_ = std::make_unique<ConnectionGuard>(options_);
  // Three connections of one key, each holding 0.9 of a window: two windows in all is its bound.
  const uint64_t each = options_.connection_window_bytes * 9 / 10;
  std::vector<Sockets::Pair> pairs;
  for (int i = 0; i < 3; ++i) {
    pairs.push_back(sockets_.Connect());
    guard_->OnAccepted(pairs.back().server);
    Transfer(pairs.back(), 100, /*read=*/true);
    Deliver(pairs.back(), "m" + std::to_string(i), std::string("mallory"), 100);
  }
  Check();
  // The first two fill up and go idle for many checks; the third then tips the key over.
  for (int i = 0; i < 2; ++i) Transfer(pairs[i], each, /*read=*/true);
  for (int i = 0; i < 100; ++i) ASSERT_FALSE(Check());
  Transfer(pairs[2], each, /*read=*/true);
  EXPECT_TRUE(Check());
  EXPECT_EQ(guard_->cut(), 1u);
}

TEST_F(GuardTest, AGroupOverItsBoundAsEstimatedIsRefinedUntilReadingMakesItReal) {
  guard_ = std::make_unique<ConnectionGuard>(options_);
  const uint64_t each = options_.connection_window_bytes * 9 / 10;
  std::vector<Sockets::Pair> pairs;
  for (int i = 0; i < 3; ++i) {
    pairs.push_back(sockets_.Connect());
    guard_->OnAccepted(pairs.back().server);
    Transfer(pairs.back(), 100, /*read=*/true);
    Deliver(pairs.back(), "m" + std::to_string(i), std::string("mallory"), 100);
  }
  Check();
  // 2.7 windows for the key, but all still in the kernel's queues: nothing held yet.
  for (const Sockets::Pair& p : pairs) Transfer(p, each, /*read=*/false);
  for (int i = 0; i < 10; ++i) ASSERT_FALSE(Check());
  // libzmq reads it all, not one byte more arriving: the next check cuts one.
  for (const Sockets::Pair& p : pairs) Drain(p);
  EXPECT_TRUE(Check());
  EXPECT_EQ(guard_->cut(), 1u);
}

TEST_F(GuardTest, AllConnectionsAreBoundedTogetherIdleOnesIncluded) {
  options_.max_buffered_bytes = 256 << 10;
  guard_ = std::make_unique<ConnectionGuard>(options_);
  // Five keys, each under its own bounds with 0.9 of a window; four are idle when the fifth
  // takes all of them past the global bound.
  const uint64_t each = options_.connection_window_bytes * 9 / 10;
  std::vector<Sockets::Pair> pairs;
  for (int i = 0; i < 5; ++i) {
    pairs.push_back(sockets_.Connect());
    guard_->OnAccepted(pairs.back().server);
    Transfer(pairs.back(), 100, /*read=*/true);
    Deliver(pairs.back(), "p" + std::to_string(i), "key" + std::to_string(i), 100);
  }
  Check();
  for (int i = 0; i < 4; ++i) Transfer(pairs[i], each, /*read=*/true);
  for (int i = 0; i < 100; ++i) ASSERT_FALSE(Check());
  Transfer(pairs[4], each, /*read=*/true);
  EXPECT_TRUE(Check());
  EXPECT_EQ(guard_->cut(), 1u);
}

TEST_F(GuardTest, ALoweredAllowanceCutsAnIdleConnectionOverItsNewBound) {
  guard_ = std::make_unique<ConnectionGuard>(options_);
  const Sockets::Pair p = sockets_.Connect();
  guard_->OnAccepted(p.server);
  Transfer(p, 100, /*read=*/true);
  Deliver(p, "peer", std::string("alice"), 100);
  guard_->SetAllowance("peer", 1 << 20);
  Check();
  // Half an upload arrives (read, not yet a whole message), then the upload stalls.
  Transfer(p, options_.connection_window_bytes * 2, /*read=*/true);
  for (int i = 0; i < 100; ++i) ASSERT_FALSE(Check());
  const uint64_t measured = guard_->measurements();
  // Its slot is taken back: the idle connection is now over its bound.
  guard_->SetAllowance("peer", 0);
  EXPECT_TRUE(Check());
  EXPECT_EQ(guard_->cut(), 1u);
  EXPECT_EQ(guard_->measurements(), measured) << "the idle connection's estimate was not reused";
}

TEST_F(GuardTest, RevocationLooksUpOnlyWhenTheListChangedAndCutsAnIdleConnection) {
  guard_ = std::make_unique<ConnectionGuard>(options_);
  std::vector<Sockets::Pair> pairs;
  for (const std::string id : {"alice", "bob", "mallory"}) {
    pairs.push_back(sockets_.Connect());
    guard_->OnAccepted(pairs.back().server);
    Transfer(pairs.back(), 100, /*read=*/true);
    Deliver(pairs.back(), "peer-" + id, id, 100);
  }
  Check();
  EXPECT_EQ(lookups_, 3);  // each identity once it is known
  for (int i = 0; i < 100; ++i) Check();
  EXPECT_EQ(lookups_, 3) << "identities were looked up while the allow-list did not change";
  // mallory's key is removed; the guard hears of it by the allow-list's generation.
  revoked_ids_ = {"mallory"};
  ++generation_;
  EXPECT_TRUE(Check());
  EXPECT_EQ(guard_->cut(), 1u);
  ASSERT_EQ(revoked_.size(), 1u);
  EXPECT_EQ(revoked_[0].auth_id, "mallory");
  EXPECT_EQ(revoked_[0].routing_id, "peer-mallory");
  EXPECT_TRUE(WasCut(pairs[2]));
  EXPECT_FALSE(WasCut(pairs[0]));
  // A connection whose first message names a revoked key is cut at the next check too.
  const Sockets::Pair late = sockets_.Connect();
  guard_->OnAccepted(late.server);
  Transfer(late, 100, /*read=*/true);
  Deliver(late, "peer-mallory-2", std::string("mallory"), 100);
  EXPECT_TRUE(Check());
  EXPECT_EQ(guard_->cut(), 2u);
}

// End to end: the ZeroMQ server with CurveZMQ, attacked by an enrolled key.
class IdleConnectionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    fs::create_directories(dir_ / "allow");
    server_keys_ = *GenerateKeyPair("server", "coordinator");
    auto port = FreeLoopbackPort();
    ASSERT_TRUE(port.ok());
    port_ = *port;
  }
  void TearDown() override { server_.reset(); }

  CurveKeyPair Client(const std::string& id) {
    auto keys = GenerateKeyPair("client", id);
    EXPECT_TRUE(keys.ok()) << keys.status();
    EXPECT_TRUE(WriteKeyFiles(*keys, (dir_ / "keys").string(), id).ok());
    fs::copy_file(dir_ / "keys" / (id + ".pub"), dir_ / "allow" / (id + ".pub"));
    return *keys;
  }

  void Bind() {
    ZmqOptions o;
    o.curve_server =
        CurveServerOptions{server_keys_, ZapOptions{(dir_ / "allow").string(), 3'600'000}};
    o.curve_server->zap.reload_requests = &reloads_;
    o.recv_hwm = 64;
    o.connection_window_bytes = 4 << 20;
    auto s = BindZmqServer("tcp://127.0.0.1:" + std::to_string(port_), o);
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = std::move(s).value();
  }

  // Runs the server's Receive loop until `done()` or `limit`; returns the messages received.
  template <typename Done>
  std::vector<Inbound> Serve(Done&& done, Clock::duration limit) {
    std::vector<Inbound> got;
    for (auto end = Clock::now() + limit; Clock::now() < end && !done();) {
      auto in = server_->Receive(20);
      EXPECT_TRUE(in.ok()) << in.status();
      if (in.ok() && in->has_value()) got.push_back(std::move(**in));
    }
    return got;
  }

  // A raw CurveZMQ peer as `keys`, its Join received by the server; nullopt on failure.
  std::optional<Inbound> Join(testing::RawCurvePeer& peer, const CurveKeyPair& keys,
                              const std::string& id) {
    Status st = peer.Connect(port_, server_keys_.public_z85, keys);
    EXPECT_TRUE(st.ok()) << st;
    const std::string header = wire::EncodeHeader(wire::MakeMessage(wire::Join{id, 1, "x"}));
    EXPECT_TRUE(peer.SendFrame(header.data(), header.size(), /*more=*/false).ok());
    std::vector<Inbound> got = Serve([] { return false; }, milliseconds(300));
    if (got.size() != 1) return std::nullopt;
    return got[0];
  }

  ::huddle::testing::ScopedTempDir tmp_{"idle_connection"};
  fs::path dir_ = tmp_.path();
  CurveKeyPair server_keys_;
  int port_ = 0;
  std::atomic<uint64_t> reloads_{0};
  std::unique_ptr<ServerTransport> server_;
};

TEST_F(IdleConnectionTest, AConnectionIdleForASecondThatStartsANeverEndingMessageIsCut) {
  const CurveKeyPair mallory = Client("mallory");
  Bind();
  testing::RawCurvePeer peer;
  ASSERT_TRUE(Join(peer, mallory, "mallory").has_value());
  // Idle for a second: forty checks that find nothing to look at.
  Serve([] { return false; }, seconds(1));
  ASSERT_EQ(server_->connections_cut(), 0u);
  std::atomic<bool> done{false};
  Status attack = absl::OkStatus();
  uint64_t written = 0;
  std::thread attacker([&] {
    const std::vector<char> frame(256 << 10, 'x');
    const uint64_t start = peer.bytes_written();
    while (attack.ok() && peer.bytes_written() - start < (uint64_t{512} << 20)) {
      attack = peer.SendFrame(frame.data(), frame.size(), /*more=*/true);
    }
    written = peer.bytes_written() - start;
    done = true;
  });
  std::vector<Inbound> got = Serve([&] { return done.load(); }, seconds(20));
  attacker.join();
  EXPECT_TRUE(got.empty()) << "an unfinished message was delivered";
  EXPECT_TRUE(absl::IsUnavailable(attack))
      << "the connection was never cut; it wrote " << written << " bytes: " << attack;
  EXPECT_LT(written, uint64_t{64} << 20);
  EXPECT_EQ(server_->connections_cut(), 1u);
}

TEST_F(IdleConnectionTest, RevokingTheKeyOfAnIdleConnectionCutsIt) {
  const CurveKeyPair mallory = Client("mallory");
  const CurveKeyPair alice = Client("alice");
  Bind();
  testing::RawCurvePeer bad, good;
  std::optional<Inbound> join = Join(bad, mallory, "mallory");
  ASSERT_TRUE(join.has_value());
  ASSERT_TRUE(Join(good, alice, "alice").has_value());
  Serve([] { return false; }, seconds(1));  // both idle
  ASSERT_EQ(server_->connections_cut(), 0u);

  fs::remove(dir_ / "allow" / "mallory.pub");
  reloads_++;  // like SIGHUP
  std::vector<Inbound> got = Serve([&] { return server_->connections_cut() > 0; }, seconds(10));
  for (const Inbound& in : Serve([] { return false; }, milliseconds(200))) got.push_back(in);
  EXPECT_EQ(server_->connections_cut(), 1u);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].auth_id, "mallory");
  EXPECT_EQ(got[0].peer, join->peer);
  EXPECT_TRUE(absl::IsPermissionDenied(got[0].message.status())) << got[0].message.status();
  // Its connection is gone; alice's is not.
  const std::vector<char> frame(1000, 'x');
  Status st = absl::OkStatus();
  for (int i = 0; i < 100 && st.ok(); ++i) {
    st = bad.SendFrame(frame.data(), frame.size(), true);
    std::this_thread::sleep_for(milliseconds(5));
  }
  EXPECT_TRUE(absl::IsUnavailable(st)) << "the revoked key's idle connection is still up";
  const std::string hb = wire::EncodeHeader(wire::MakeMessage(wire::Heartbeat{}));
  ASSERT_TRUE(good.SendFrame(hb.data(), hb.size(), /*more=*/false).ok());
  got = Serve([] { return false; }, milliseconds(300));
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].auth_id, "alice");
  EXPECT_TRUE(got[0].message.ok()) << got[0].message.status();
}

}  // namespace
}  // namespace huddle::transport
