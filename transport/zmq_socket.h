// Internal to the ZeroMQ transport (zmq_transport.cc: the server; zmq_client.cc: the client): the
// socket plumbing both sides share. Not for use outside transport/.
#pragma once

#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>
#include <zmq.hpp>

#include "common/status.h"
#include "proto/codec.h"
#include "transport/zmq_transport.h"

namespace huddle::transport::zmq_internal {

// Sends header + payload frames, after `prefix` frames (the routing id on the ROUTER).
// Returns bytes sent, Unavailable if the queue is full, NotFound if the peer is unknown.
StatusOr<size_t> SendFrames(zmq::socket_t& socket, const std::string* routing_id,
                            const wire::Message& msg);

int64_t SteadyNowMs();

// Attaches a socket monitor (zmq_socket_monitor) for `events` to `socket` and returns the PAIR
// socket its events arrive on. Handshake outcomes are only visible this way.
zmq::socket_t StartMonitor(zmq::context_t& context, zmq::socket_t& socket, int events,
                           const char* role);

struct MonitorEvent {
  uint16_t id = 0;
  uint32_t value = 0;  // e.g. the ZMTP protocol error, or the ZAP status code
};

// The next queued monitor event, or nullopt when none is queued.
std::optional<MonitorEvent> NextMonitorEvent(zmq::socket_t& monitor);

// One multipart message as received, before decoding. The routing id (ROUTER side) is in
// `prefix`; at most max_frames frames are kept, the rest are drained.
struct RawMessage {
  std::string prefix;
  std::vector<wire::Frame> frames;
  std::optional<std::string> user_id;  // ZAP User-Id of the connection, when authenticated
  std::string auth_key;  // the key it was admitted with (kZapKeyProperty), Z85; "" when unknown
  size_t bytes = 0;
  uint64_t wire_bytes = 0;  // what its frames took on the wire (WireBytes), the prefix excluded
  int source_fd = -1;       // the connection's socket (ZMQ_SRCFD), -1 if unknown
  bool too_many = false;
};

RawMessage RecvRaw(zmq::socket_t& socket, bool has_prefix, const wire::CodecLimits& limits,
                   bool curve = false);

StatusOr<wire::Message> DecodeRaw(const RawMessage& raw, const wire::CodecLimits& limits);

void SetCommonOptions(zmq::socket_t& s, const ZmqOptions& o);

}  // namespace huddle::transport::zmq_internal
