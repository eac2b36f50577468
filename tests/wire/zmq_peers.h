// Test helpers for the ZeroMQ transport tests (secure_transport_test, hostile_peer_test): a client
// connected to a bound server, and a Join sent until the server has received it. Every wait is a
// loop of short Receive calls bounded by a deadline.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "gtest/gtest.h"
#include "proto/messages.h"
#include "transport/curve_keys.h"
#include "transport/zmq_transport.h"

namespace huddle::transport::testing {

// A client connected to `endpoint`, or nullptr (after a test failure naming why).
inline std::unique_ptr<ClientTransport> Connect(const std::string& endpoint,
                                                const ZmqOptions& options) {
  auto c = ConnectZmqClient(endpoint, options);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? std::move(c).value() : nullptr;
}

// A client's options for a CurveZMQ server whose keys are `server`, with the client's keys.
inline ZmqOptions CurveClient(const CurveKeyPair& server, const CurveKeyPair& client) {
  ZmqOptions o;
  o.curve_client = CurveClientOptions{server.public_z85, client};
  return o;
}

// How JoinAndReceive waits.
struct JoinWait {
  // Return the first message the server receives from anyone (else only one from `id`).
  bool from_anyone = false;
  // A transport error on the client ends the wait with a test failure (else it is not looked at).
  bool fail_on_client_error = false;
};

// Sends Join as `id` every 100 ms, for at most 10 s, until `server` receives a message (from `id`
// unless `how.from_anyone`); returns it, or nullopt if none came.
inline std::optional<Inbound> JoinAndReceive(ServerTransport& server, ClientTransport& client,
                                             const std::string& id, JoinWait how = {}) {
  using Clock = std::chrono::steady_clock;
  for (auto end = Clock::now() + std::chrono::seconds(10); Clock::now() < end;) {
    (void)client.Send(wire::MakeMessage(wire::Join{id, 10, "test"}));
    for (auto next = Clock::now() + std::chrono::milliseconds(100); Clock::now() < next;) {
      auto in = server.Receive(20);
      if (in.ok() && in->has_value() && (how.from_anyone || (*in)->auth_id == id)) {
        return std::move(**in);
      }
    }
    if (how.fail_on_client_error) {
      auto back = client.Receive(0);
      if (!back.ok()) {
        ADD_FAILURE() << "client error: " << back.status();
        return std::nullopt;
      }
    }
  }
  return std::nullopt;
}

}  // namespace huddle::transport::testing
