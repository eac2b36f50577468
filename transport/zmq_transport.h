// ZeroMQ transports: the coordinator binds a ROUTER socket, each client connects a DEALER.
//
// Tensor payloads are sent zero-copy (the ZeroMQ frame references the payload's memory and holds a
// reference to its owner until the I/O thread is done) and received zero-copy (the decoded
// Message's payloads point into the received frames).
//
// Limits: ZMQ_MAXMSGSIZE bounds any single frame a peer can make us allocate (the peer is
// disconnected past it); the codec bounds headers, tensor counts and shapes.
#pragma once

#include <memory>
#include <string>

#include "proto/codec.h"
#include "transport/transport.h"

namespace huddle::transport {

struct ZmqOptions {
  int io_threads = 1;
  int64_t max_frame_bytes = int64_t{2} << 30;  // ZMQ_MAXMSGSIZE
  int send_hwm = 1000;
  int recv_hwm = 1000;
  int reconnect_ivl_ms = 100;
  int reconnect_ivl_max_ms = 5000;
  wire::CodecLimits codec;
};

// Binds `endpoint` (e.g. "tcp://0.0.0.0:5555"). InvalidArgument / Unavailable with the endpoint
// named if the bind fails (bad syntax, port in use).
StatusOr<std::unique_ptr<ServerTransport>> BindZmqServer(const std::string& endpoint,
                                                         const ZmqOptions& options = {});

// Connects (asynchronously; ZeroMQ retries in the background) to `endpoint`.
StatusOr<std::unique_ptr<ClientTransport>> ConnectZmqClient(const std::string& endpoint,
                                                            const ZmqOptions& options = {});

}  // namespace huddle::transport
