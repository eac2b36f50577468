// ZeroMQ transports: the coordinator binds a ROUTER socket, each client connects a DEALER.
//
// Tensor payloads are sent zero-copy (the ZeroMQ frame references the payload's memory and holds a
// reference to its owner until the I/O thread is done) and received zero-copy (the decoded
// Message's payloads point into the received frames).
//
// Security (docs/security.md): with `curve_server` the coordinator's socket is a CurveZMQ server
// and a ZapHandler admits only enrolled client keys; every Inbound then carries the client id its
// key is enrolled as (auth_id). A key revoked since its handshake has its connections cut at the
// next check, each reported by one PermissionDenied Inbound (as is any message of it still read).
// With `curve_client` the client pins the coordinator's public key; a handshake refused by the
// coordinator (key not enrolled) or failing repeatedly (wrong pinned server key, or one side
// without encryption) makes Receive() return a clear error naming the likely cause.
//
// Limits: ZMQ_MAXMSGSIZE bounds any single frame a peer can make us allocate (the peer is
// disconnected past it; tensors travel in frames of at most wire::kMaxChunkBytes, so the default
// admits nothing larger than a header or a chunk); the codec bounds headers, tensor counts and
// shapes; at most codec.max_frames frames per message are kept; a token bucket per authenticated
// identity (all connections of one key share it; per connection without authentication) drops
// messages beyond max_messages_per_s (bursts of burst_messages) before they are decoded.
//
// What one connection can make the server buffer is bounded by the server itself, because libzmq
// does not: its receive high-water mark counts complete messages only, and the frames of an
// unfinished multipart message are buffered without limit. Every connection_check_ms, inside
// Receive(), the server compares what the kernel says libzmq has read from each connection with
// what was delivered from it (reading the kernel's counters again only for the connections that
// received bytes since the last check, or whose bound is at stake: connection_guard.h, "What a
// check looks at"; an idle connection costs nothing), and shuts down a connection holding more
// than connection_window_bytes plus its peer's upload allowance (SetUploadAllowance; spent by the
// messages read from the peer). A message that alone exceeds that bound is dropped and its
// connection cut too. So a connection costs at most its bound plus what arrives between two checks
// (its rate times connection_check_ms; the checks run inside Receive(), so a caller busy elsewhere
// checks later), or, for a peer that has stopped reading what the server sends (its send buffer
// full), its rate times writability_check_ms until the server finds it so (and connection_check_ms
// from then on). A connection whose key is revoked is cut at the next check, even mid-message.
//
// In aggregate, because a bound per connection is not a bound per peer: the connections of one
// identity (its key, known from its connection's first delivered message) hold together at most
// two windows plus its upload allowance; connections that have not delivered a message yet are
// counted against their IP address, together at most unidentified_bytes_per_address; and all
// connections together at most max_buffered_bytes plus the upload allowances granted. Past a
// bound the largest holders of that identity or address are cut first, and past the global one
// those of the identity or address that holds the most: an honest peer is cut only if it holds
// more than every attacker. Large buffers are returned to the system when freed (the server pins
// glibc's mmap threshold at 128 KiB), so memory comes back after cuts.
// Cuts, refused handshakes and rate-limit drops are counted exactly (connections_cut(),
// auth_rejections(), rate_limited()) and logged at most once per log_period_ms per kind, as a
// summary line. Needs Linux TCP counters (tcpi_bytes_received, 4.1+); without them (an ipc://
// endpoint) the bound is not enforced and a warning says so.
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
  // Server side, per authenticated identity (all connections of one key share it), or per
  // connection without authentication (0: unlimited).
  double max_messages_per_s = 100;
  double burst_messages = 200;
  // Server side: the bytes one connection may hold undelivered in ZeroMQ's buffers (a message
  // still arriving, complete messages not yet read, its handshake) beyond its peer's upload
  // allowance (ServerTransport::SetUploadAllowance); past it the connection is cut. Enough for
  // recv_hwm small messages.
  size_t connection_window_bytes = size_t{4} << 20;
  // Server side, in aggregate across connections (see "Limits"): what the connections of one
  // unidentified address (those that have not delivered a message yet, so whose key is not known)
  // may hold together, and what all connections may hold together beyond the upload allowances
  // granted. Past either, the largest holders are cut first.
  size_t unidentified_bytes_per_address = size_t{64} << 20;
  size_t max_buffered_bytes = size_t{256} << 20;
  // How often Receive() checks the connections (one getsockopt per connection that received
  // bytes since the last check); what a peer sends between two checks is what it can hold beyond
  // its bound.
  int64_t connection_check_ms = 25;
  // How often the server looks for connections that are not writable (their peer does not read
  // what the server sends): epoll may not report their arrivals, so they are measured at every
  // check once found. What such a peer sends between two of these passes is what it can hold
  // beyond its bound (see "Limits"). A pass costs about a microsecond per connection.
  int64_t writability_check_ms = 250;
  int64_t log_period_ms = 10'000;           // refusals, drops and cuts: at most one line per kind
  int handshake_failures_before_error = 3;  // client side, consecutive, without a success
  // Client side: > 0: a handshake refused because this client's key is not enrolled (or was
  // revoked) is retried, backing off from reconnect_ivl_ms up to this, and logged once (an
  // enrolment may be on its way: the coordinator picks it up within a second); the caller bounds
  // the wait (client::RunnerOptions::give_up_after_ms) and ClientTransport::ConnectionProblem()
  // says why it could not get in. 0: the refusal is a PermissionDenied error from Receive().
  int64_t refused_retry_max_ms = 0;
};

// Binds `endpoint` (e.g. "tcp://0.0.0.0:5555"). InvalidArgument / Unavailable with the endpoint
// named if the bind fails (bad syntax, port in use).
StatusOr<std::unique_ptr<ServerTransport>> BindZmqServer(const std::string& endpoint,
                                                         const ZmqOptions& options = {});

// Connects (asynchronously; ZeroMQ retries in the background) to `endpoint`.
StatusOr<std::unique_ptr<ClientTransport>> ConnectZmqClient(const std::string& endpoint,
                                                            const ZmqOptions& options = {});

}  // namespace huddle::transport
