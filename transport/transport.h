// Transports move wire::Messages between the coordinator and its clients. The coordinator and the
// client agent are written once against these interfaces; ZeroMQ carries them between processes
// (zmq_transport.h), and an in-process transport carries them inside one process for simulations of
// large populations (inproc_transport.h: in real time; sim_transport.h: on a virtual clock).
//
// Neither call ever blocks past its timeout. Bytes that fail to decode arrive as an Inbound whose
// `message` holds the decode error, so the receiver can log and count them against the peer.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "common/status.h"
#include "proto/messages.h"

namespace huddle::transport {

// Opaque peer address chosen by the transport (a ZeroMQ routing id, an in-process index).
using PeerId = std::string;

// Printable form of a peer id (hex for binary ZeroMQ routing ids).
std::string PeerName(const PeerId& peer);

struct Inbound {
  PeerId peer;
  // The client id the peer's key is enrolled as, from the CurveZMQ handshake (ZAP). Empty on
  // transports that do not authenticate (--insecure, in-process), where the Join's id is taken on
  // trust.
  std::string auth_id;
  StatusOr<wire::Message> message = absl::UnknownError("unset");
  size_t wire_bytes = 0;
};

// The coordinator's side. Not thread-safe: one thread owns it.
class ServerTransport {
 public:
  virtual ~ServerTransport() = default;
  // Queues `msg` for `peer` without blocking. NotFound if the peer is gone; Unavailable if its
  // queue is full.
  virtual Status Send(const PeerId& peer, const wire::Message& msg) = 0;
  // The next inbound message, or nullopt once `timeout_ms` has passed with none.
  virtual StatusOr<std::optional<Inbound>> Receive(int64_t timeout_ms) = 0;
  virtual uint64_t bytes_in() const = 0;
  virtual uint64_t bytes_out() const = 0;
  // Whether every Inbound carries the auth_id its key was enrolled as.
  virtual bool authenticates() const { return false; }
  // Since start: connections refused at the handshake (unknown or revoked key) and messages dropped
  // by the rate limit (per authenticated identity, else per peer).
  virtual uint64_t auth_rejections() const { return 0; }
  virtual uint64_t rate_limited() const { return 0; }
  // Since start: live connections the transport cut (a peer holding more undelivered bytes than
  // its bound, or a key revoked while connected).
  virtual uint64_t connections_cut() const { return 0; }
  // Lets `peer` send messages of up to `bytes` bytes in all (an upload grant: a FitResult
  // carrying a model); 0 withdraws it. Without one, a connection may hold only the transport's
  // small fixed window of undelivered bytes before it is cut (ZmqOptions).
  virtual void SetUploadAllowance(const PeerId& /*peer*/, size_t /*bytes*/) {}
  // Thread-safe, unlike the rest: a Receive() blocked on the owning thread returns (nullopt)
  // promptly, so that the owner can act on work another thread queued for it (a service's jobs
  // queue their sends for the thread that owns the transport).
  virtual void Wake() {}
};

// A client's side. Not thread-safe: one thread owns it.
class ClientTransport {
 public:
  virtual ~ClientTransport() = default;
  // Queues `msg` for the coordinator without blocking. Unavailable while not connected.
  virtual Status Send(const wire::Message& msg) = 0;
  // The next message from the coordinator (or a decode error), or nullopt after `timeout_ms`.
  virtual StatusOr<std::optional<StatusOr<wire::Message>>> Receive(int64_t timeout_ms) = 0;
  // Drops the connection and everything queued on it and connects afresh.
  virtual Status Reconnect() = 0;
  // Why the coordinator has not been reached, when the transport knows (e.g. its handshakes are
  // being refused); empty otherwise.
  virtual std::string ConnectionProblem() const { return {}; }
};

}  // namespace huddle::transport
