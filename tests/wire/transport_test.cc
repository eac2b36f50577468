// The ZeroMQ transport over 127.0.0.1: a coordinator (ROUTER) and clients (DEALER) in one process,
// plus raw cppzmq DEALERs that play a broken or hostile peer (garbage frames, oversized frames).
// Every wait is a loop of short Receive calls bounded by a deadline.
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <optional>
#include <string>
#include <thread>
#include <vector>
#include <zmq.hpp>

#include "gtest/gtest.h"
#include "proto/codec.h"
#include "tests/wire/wire_testing.h"
#include "transport/ports.h"
#include "transport/zmq_transport.h"

namespace huddle::transport {
namespace {

using Clock = std::chrono::steady_clock;
using wire::Message;
using wire::testutil::Describe;
using wire::testutil::ExpectSamePayloads;
using wire::testutil::IsError;

constexpr auto kDeadline = std::chrono::seconds(5);

// A TCP port on 127.0.0.1 that nothing listened on a moment ago.
int FreePort() {
  auto port = FreeLoopbackPort();
  return port.ok() ? *port : 0;
}
std::string LocalEndpoint(int port) { return "tcp://127.0.0.1:" + std::to_string(port); }

// Watches a socket's connection events (zmq_socket_monitor) through an inproc PAIR socket.
class ConnectionMonitor {
 public:
  ConnectionMonitor(zmq::context_t& context, zmq::socket_t& watched, const std::string& name)
      : watched_(watched), events_(context, zmq::socket_type::pair) {
    const std::string address = "inproc://monitor-" + name;
    EXPECT_EQ(zmq_socket_monitor(watched.handle(), address.c_str(),
                                 ZMQ_EVENT_CONNECTED | ZMQ_EVENT_DISCONNECTED),
              0);
    events_.set(zmq::sockopt::linger, 0);
    events_.connect(address);
  }
  ~ConnectionMonitor() { zmq_socket_monitor(watched_.handle(), nullptr, 0); }

  // True once `event` is seen, false if the deadline passes first.
  bool WaitFor(uint16_t event) {
    for (const auto end = Clock::now() + kDeadline; Clock::now() < end;) {
      zmq::message_t head, address;
      if (!events_.recv(head, zmq::recv_flags::dontwait)) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
        continue;
      }
      (void)events_.recv(address);  // the event's second frame, always present
      uint16_t got = 0;
      std::memcpy(&got, head.data(), sizeof(got));
      if (got == event) return true;
    }
    return false;
  }

 private:
  zmq::socket_t& watched_;
  zmq::socket_t events_;
};

class ZmqTransportTest : public ::testing::Test {
 protected:
  void SetUp() override { BindServer(ZmqOptions{}); }

  // (Re)binds the coordinator on a fresh port; retried in case another process takes the port.
  void BindServer(const ZmqOptions& options) {
    server_.reset();
    for (int attempt = 0; attempt < 5 && server_ == nullptr; ++attempt) {
      endpoint_ = LocalEndpoint(FreePort());
      StatusOr<std::unique_ptr<ServerTransport>> s = BindZmqServer(endpoint_, options);
      if (s.ok()) server_ = std::move(s).value();
    }
    ASSERT_NE(server_, nullptr) << "no free port on 127.0.0.1";
  }

  std::unique_ptr<ClientTransport> Connect() {
    StatusOr<std::unique_ptr<ClientTransport>> c = ConnectZmqClient(endpoint_);
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? std::move(c).value() : nullptr;
  }

  // ZMQ_IMMEDIATE refuses sends until the TCP connection is up: retry until then.
  static void SendWhenConnected(ClientTransport& client, const Message& msg) {
    Status st = client.Send(msg);
    for (const auto end = Clock::now() + kDeadline; !st.ok() && Clock::now() < end;) {
      ASSERT_EQ(st.code(), absl::StatusCode::kUnavailable) << st;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      st = client.Send(msg);
    }
    ASSERT_TRUE(st.ok()) << st;
  }

  // The server's next inbound message, or nullopt after `wait`.
  std::optional<Inbound> ServerReceive(Clock::duration wait = kDeadline) {
    for (const auto end = Clock::now() + wait; Clock::now() < end;) {
      StatusOr<std::optional<Inbound>> r = server_->Receive(50);
      EXPECT_TRUE(r.ok()) << r.status();
      if (!r.ok()) return std::nullopt;
      if (r->has_value()) return std::move(*r);
    }
    return std::nullopt;
  }

  static std::optional<StatusOr<Message>> ClientReceive(ClientTransport& client) {
    for (const auto end = Clock::now() + kDeadline; Clock::now() < end;) {
      auto r = client.Receive(50);
      EXPECT_TRUE(r.ok()) << r.status();
      if (!r.ok()) return std::nullopt;
      if (r->has_value()) return std::move(*r);
    }
    return std::nullopt;
  }

  // Client sends a Join; returns the peer id the server saw it under.
  PeerId Join(ClientTransport& client, const std::string& id) {
    SendWhenConnected(client, wire::MakeMessage(wire::Join{id, 10, "test"}, 0, id));
    std::optional<Inbound> in = ServerReceive();
    EXPECT_TRUE(in.has_value()) << "no Join from " << id;
    if (!in) return {};
    EXPECT_TRUE(in->message.ok()) << in->message.status();
    if (in->message.ok()) {
      EXPECT_EQ(std::get<wire::Join>(in->message->body).client_id, id);
    }
    return in->peer;
  }

  // A full Join -> Welcome exchange for a fresh, well-behaved client.
  void ExpectGoodClientIsServed() {
    std::unique_ptr<ClientTransport> good = Connect();
    const PeerId peer = Join(*good, "good-client");
    ASSERT_TRUE(server_->Send(peer, wire::testutil::SampleWelcome()).ok());
    auto reply = ClientReceive(*good);
    ASSERT_TRUE(reply.has_value() && reply->ok());
    EXPECT_EQ((*reply)->type(), wire::MessageType::kWelcome);
  }

  // A raw DEALER, as a peer that does not speak Huddle would connect.
  zmq::socket_t RawDealer() {
    zmq::socket_t s(raw_context_, zmq::socket_type::dealer);
    s.set(zmq::sockopt::linger, 0);
    s.connect(endpoint_);
    return s;
  }

  zmq::context_t raw_context_;
  std::string endpoint_;
  std::unique_ptr<ServerTransport> server_;
};

TEST_F(ZmqTransportTest, JoinIsAnsweredWithWelcome) {
  std::unique_ptr<ClientTransport> client = Connect();
  const Message join = wire::testutil::SampleJoin();
  SendWhenConnected(*client, join);
  std::optional<Inbound> in = ServerReceive();
  ASSERT_TRUE(in.has_value());
  ASSERT_TRUE(in->message.ok()) << in->message.status();
  EXPECT_EQ(Describe(*in->message), Describe(join));
  EXPECT_FALSE(in->peer.empty());

  const Message welcome = wire::testutil::SampleWelcome();
  ASSERT_TRUE(server_->Send(in->peer, welcome).ok());
  auto reply = ClientReceive(*client);
  ASSERT_TRUE(reply.has_value());
  ASSERT_TRUE(reply->ok()) << reply->status();
  EXPECT_EQ(Describe(**reply), Describe(welcome));
}

TEST_F(ZmqTransportTest, MegabyteTensorsArriveIntactBothWays) {
  std::unique_ptr<ClientTransport> client = Connect();
  const PeerId peer = Join(*client, "c1");

  Message result = wire::testutil::SampleFitResult();
  result.tensors = {wire::testutil::Payload("fc0.weight", {512, 512}, 1.0f),
                    wire::testutil::Payload("fc0.bias", {262144}, -7.0f)};
  ASSERT_EQ(result.PayloadBytes(), size_t{2} << 20);
  ASSERT_TRUE(client->Send(result).ok());
  std::optional<Inbound> in = ServerReceive();
  ASSERT_TRUE(in.has_value());
  ASSERT_TRUE(in->message.ok()) << in->message.status();
  EXPECT_EQ(in->peer, peer);
  EXPECT_EQ(Describe(*in->message), Describe(result));
  ExpectSamePayloads(in->message->tensors, result.tensors);

  // Server to client, zero-copy: the frames hold the model alive after the sender lets go.
  auto model = std::make_shared<TensorList>(wire::ToTensors(result.tensors));
  std::weak_ptr<const TensorList> watch = model;
  Message fit = wire::testutil::SampleFitInstruction();
  fit.tensors = wire::ShareAll(model);
  const std::string expected = Describe(fit);
  ASSERT_TRUE(server_->Send(peer, fit).ok());
  fit.tensors.clear();
  model.reset();
  auto got = ClientReceive(*client);
  ASSERT_TRUE(got.has_value() && got->ok());
  EXPECT_EQ(Describe(**got), expected);
  ExpectSamePayloads((*got)->tensors, result.tensors);
  // ...and release it once ZeroMQ is done with the frames.
  for (const auto end = Clock::now() + kDeadline; !watch.expired() && Clock::now() < end;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_TRUE(watch.expired()) << "the sent model was never released";
}

TEST_F(ZmqTransportTest, SendToAnUnknownPeerIsNotFound) {
  EXPECT_TRUE(IsError(server_->Send("nobody", wire::testutil::SampleHeartbeat()),
                      absl::StatusCode::kNotFound, "not connected"));
  EXPECT_EQ(server_->bytes_out(), 0u);
}

TEST_F(ZmqTransportTest, ClientSendWithoutAServerIsUnavailable) {
  StatusOr<std::unique_ptr<ClientTransport>> client = ConnectZmqClient(LocalEndpoint(FreePort()));
  ASSERT_TRUE(client.ok()) << client.status() << " (connecting is asynchronous)";
  EXPECT_TRUE(IsError((*client)->Send(wire::testutil::SampleJoin()), absl::StatusCode::kUnavailable,
                      "no connection"));
  const auto start = Clock::now();
  auto r = (*client)->Receive(20);
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->has_value());
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(1));
}

TEST_F(ZmqTransportTest, ReconnectShowsUpAsANewPeer) {
  std::unique_ptr<ClientTransport> client = Connect();
  const PeerId before = Join(*client, "c1");
  ASSERT_TRUE(client->Reconnect().ok());
  const PeerId after = Join(*client, "c1");
  EXPECT_NE(before, after);
  ASSERT_TRUE(server_->Send(after, wire::testutil::SampleWelcome()).ok());
  auto reply = ClientReceive(*client);
  ASSERT_TRUE(reply.has_value() && reply->ok());
  // The old connection goes away once the server notices it closed.
  Status st = absl::OkStatus();
  for (const auto end = Clock::now() + kDeadline; st.ok() && Clock::now() < end;) {
    st = server_->Send(before, wire::testutil::SampleHeartbeat());
    if (st.ok()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(st.code(), absl::StatusCode::kNotFound) << st;
}

TEST_F(ZmqTransportTest, GarbageFromARawPeerIsADecodeErrorAndServingContinues) {
  zmq::socket_t raw = RawDealer();
  // 1: not a protobuf. 2: a valid header that lists two tensors, with one short frame.
  // 3: more frames than the codec's limit (drained, never all kept).
  ASSERT_TRUE(raw.send(zmq::str_buffer("\xff\xff\xff\xff garbage"), zmq::send_flags::none));
  const std::string header = wire::EncodeHeader(wire::testutil::SampleFitResult());
  ASSERT_TRUE(raw.send(zmq::buffer(header), zmq::send_flags::sndmore));
  ASSERT_TRUE(raw.send(zmq::str_buffer("1234"), zmq::send_flags::none));
  const int too_many = static_cast<int>(wire::CodecLimits{}.max_frames) + 1;
  for (int i = 0; i < too_many; ++i) {
    ASSERT_TRUE(raw.send(zmq::str_buffer("x"),
                         i + 1 < too_many ? zmq::send_flags::sndmore : zmq::send_flags::none));
  }
  const std::string expected[] = {"does not parse", "frame 1 of 1 has 4 bytes, expected 48",
                                  absl::StrCat("more than ", too_many - 1, " frames")};
  PeerId raw_peer;
  for (const std::string& needle : expected) {
    std::optional<Inbound> in = ServerReceive();
    ASSERT_TRUE(in.has_value()) << "expected an Inbound with \"" << needle << "\"";
    EXPECT_TRUE(IsError(in->message, absl::StatusCode::kInvalidArgument, needle));
    if (raw_peer.empty()) raw_peer = in->peer;
    EXPECT_EQ(in->peer, raw_peer) << "errors are attributed to the peer that sent them";
    EXPECT_GT(in->wire_bytes, 0u);
  }
  // The bad peer can still be answered, and a good client is served as usual.
  ASSERT_TRUE(server_->Send(raw_peer, wire::MakeError(wire::ErrorCode::kMalformed, "bad")).ok());
  zmq::message_t answer;
  raw.set(zmq::sockopt::rcvtimeo, 5000);
  ASSERT_TRUE(raw.recv(answer));
  wire::Frame frame{nullptr,
                    std::span(static_cast<const std::byte*>(answer.data()), answer.size())};
  StatusOr<Message> decoded = wire::Decode(std::span(&frame, 1));
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(std::get<wire::Error>(decoded->body).code, wire::ErrorCode::kMalformed);
  ExpectGoodClientIsServed();
}

TEST_F(ZmqTransportTest, AFrameOverMaxFrameBytesDisconnectsThePeer) {
  ZmqOptions small;
  small.max_frame_bytes = 4096;
  BindServer(small);
  zmq::socket_t raw(raw_context_, zmq::socket_type::dealer);
  raw.set(zmq::sockopt::linger, 0);
  ConnectionMonitor monitor(raw_context_, raw, "oversized");
  raw.connect(endpoint_);
  ASSERT_TRUE(monitor.WaitFor(ZMQ_EVENT_CONNECTED));
  ASSERT_TRUE(raw.send(zmq::buffer(std::string(64 * 1024, 'x')), zmq::send_flags::none));
  EXPECT_TRUE(monitor.WaitFor(ZMQ_EVENT_DISCONNECTED)) << "the server kept the connection";
  EXPECT_FALSE(ServerReceive(std::chrono::milliseconds(100)).has_value());
  ExpectGoodClientIsServed();
}

TEST_F(ZmqTransportTest, ByteCountersCountHeadersAndPayloads) {
  std::unique_ptr<ClientTransport> client = Connect();
  const Message join = wire::testutil::SampleJoin();
  SendWhenConnected(*client, join);
  std::optional<Inbound> in = ServerReceive();
  ASSERT_TRUE(in.has_value());
  // wire_bytes counts the frames the server read (the routing id frame included).
  const size_t join_bytes = wire::EncodeHeader(join).size();
  EXPECT_GE(in->wire_bytes, join_bytes);
  EXPECT_LE(in->wire_bytes, join_bytes + in->peer.size());
  EXPECT_EQ(server_->bytes_in(), in->wire_bytes);

  const Message fit = wire::testutil::SampleFitInstruction();
  ASSERT_TRUE(server_->Send(in->peer, fit).ok());
  EXPECT_EQ(server_->bytes_out(), wire::EncodeHeader(fit).size() + fit.PayloadBytes());
  ASSERT_TRUE(server_->Send(in->peer, wire::testutil::SampleHeartbeat()).ok());
  EXPECT_EQ(server_->bytes_out(), wire::EncodeHeader(fit).size() + fit.PayloadBytes() +
                                      wire::EncodeHeader(wire::testutil::SampleHeartbeat()).size());
}

TEST_F(ZmqTransportTest, BindFailuresAreStatusesNamingTheEndpoint) {
  // Port in use: this fixture's server holds endpoint_.
  StatusOr<std::unique_ptr<ServerTransport>> twice = BindZmqServer(endpoint_);
  EXPECT_TRUE(IsError(twice, absl::StatusCode::kUnavailable, endpoint_));
  // Bad syntax: InvalidArgument, as zmq_transport.h promises.
  EXPECT_TRUE(IsError(BindZmqServer("tcp://127.0.0.1:notaport"), absl::StatusCode::kInvalidArgument,
                      "tcp://127.0.0.1:notaport"));
  EXPECT_TRUE(
      IsError(ConnectZmqClient("bogus://x"), absl::StatusCode::kInvalidArgument, "bogus://x"));
}

TEST_F(ZmqTransportTest, InvalidOptionsAreAStatusNotAnException) {
  // Options come from the job's YAML; a bad value must not throw out of the transport.
  ZmqOptions bad;
  bad.send_hwm = -1;
  StatusOr<std::unique_ptr<ServerTransport>> server = absl::UnknownError("not run");
  try {
    server = BindZmqServer(LocalEndpoint(FreePort()), bad);
  } catch (const zmq::error_t& e) {
    FAIL() << "BindZmqServer threw zmq::error_t: " << e.what();
  }
  EXPECT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument) << server.status();
  StatusOr<std::unique_ptr<ClientTransport>> client = ConnectZmqClient(endpoint_, bad);
  EXPECT_EQ(client.status().code(), absl::StatusCode::kInvalidArgument) << client.status();
}

TEST(PeerNameTest, PrintsPrintableIdsAndHexOtherwise) {
  EXPECT_EQ(PeerName("client-7"), "client-7");
  EXPECT_EQ(PeerName(std::string("\x00\x6b\x8b\x45\x67", 5)), "0x006b8b4567");
  EXPECT_EQ(PeerName("has space"), "0x686173207370616365");
}

}  // namespace
}  // namespace huddle::transport
