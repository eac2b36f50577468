// ZeroMQ transports: the coordinator binds a ROUTER socket, each client connects a DEALER.
//
// Tensor payloads are sent zero-copy (the ZeroMQ frame references the payload's memory and holds a
// reference to its owner until the I/O thread is done) and received zero-copy (the decoded
// Message's payloads point into the received frames).
//
// Security (docs/security.md): with `curve_server` the coordinator's socket is a CurveZMQ server
// and a ZapHandler admits only enrolled client keys; every Inbound then carries the client id its
// key is enrolled as (auth_id), and a message from a key revoked since its handshake arrives as
// PermissionDenied. With `curve_client` the client pins the coordinator's public key; a handshake
// refused by the coordinator (key not enrolled) or failing repeatedly (wrong pinned server key, or
// one side without encryption) makes Receive() return a clear error naming the likely cause.
//
// Limits: ZMQ_MAXMSGSIZE bounds any single frame a peer can make us allocate (the peer is
// disconnected past it; tensors travel in frames of at most wire::kMaxChunkBytes, so the default
// admits nothing larger than a header or a chunk); the codec bounds headers, tensor counts and
// shapes; at most codec.max_frames frames per message are kept; a per-peer token bucket drops
// messages beyond max_messages_per_s (bursts of burst_messages) before they are decoded; the
// receive high-water mark bounds what ZeroMQ queues per peer, so a flooding peer is throttled by
// TCP backpressure.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "proto/codec.h"
#include "transport/curve_keys.h"
#include "transport/transport.h"
#include "transport/zap_handler.h"

namespace huddle::transport {

struct CurveServerOptions {
  CurveKeyPair server;  // with its secret half
  ZapOptions zap;       // the allow-list of client keys
};

struct CurveClientOptions {
  std::string server_public_z85;  // the coordinator's key, pinned
  CurveKeyPair client;            // with its secret half
};

struct ZmqOptions {
  int io_threads = 1;
  // ZMQ_MAXMSGSIZE: the larger of a header and a tensor chunk, plus slack.
  int64_t max_frame_bytes = static_cast<int64_t>(wire::kMaxChunkBytes) + 64 * 1024 + 4096;
  int send_hwm = 1000;
  int recv_hwm = 1000;
  int reconnect_ivl_ms = 100;
  int reconnect_ivl_max_ms = 5000;
  wire::CodecLimits codec;
  std::optional<CurveServerOptions> curve_server;
  std::optional<CurveClientOptions> curve_client;
  double max_messages_per_s = 100;  // per peer, server side (0: unlimited)
  double burst_messages = 200;
  int handshake_failures_before_error = 3;  // client side, consecutive, without a success
};

// Binds `endpoint` (e.g. "tcp://0.0.0.0:5555"). InvalidArgument / Unavailable with the endpoint
// named if the bind fails (bad syntax, port in use).
StatusOr<std::unique_ptr<ServerTransport>> BindZmqServer(const std::string& endpoint,
                                                         const ZmqOptions& options = {});

// Connects (asynchronously; ZeroMQ retries in the background) to `endpoint`.
StatusOr<std::unique_ptr<ClientTransport>> ConnectZmqClient(const std::string& endpoint,
                                                            const ZmqOptions& options = {});

}  // namespace huddle::transport
