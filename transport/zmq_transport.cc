#include "transport/zmq_transport.h"

#include <malloc.h>
#include <spdlog/spdlog.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <deque>
#include <unordered_map>
#include <vector>
#include <zmq.hpp>

#include "common/clock.h"
#include "common/logging.h"
#include "transport/connection_guard.h"
#include "transport/rate_limiter.h"

namespace huddle::transport {
namespace {

// Frees a zero-copy frame: drops the payload owner's reference.
void ReleaseOwner(void* /*data*/, void* hint) {
  delete static_cast<std::shared_ptr<const void>*>(hint);
}

// A frame referencing `chunk` (part of p's bytes) that keeps p's owner alive until sent.
zmq::message_t ZeroCopyFrame(const wire::TensorPayload& p, std::span<const std::byte> chunk) {
  if (chunk.empty()) return zmq::message_t();
  auto* hint = new std::shared_ptr<const void>(p.owner);
  return zmq::message_t(const_cast<std::byte*>(chunk.data()), chunk.size(), &ReleaseOwner, hint);
}

// Sends header + payload frames, after `prefix` frames (the routing id on the ROUTER).
// Returns bytes sent, Unavailable if the queue is full, NotFound if the peer is unknown.
StatusOr<size_t> SendFrames(zmq::socket_t& socket, const std::string* routing_id,
                            const wire::Message& msg) {
  const std::string header = wire::EncodeHeader(msg);
  size_t bytes = header.size();
  try {
    if (routing_id != nullptr) {
      auto sent = socket.send(zmq::buffer(*routing_id),
                              zmq::send_flags::sndmore | zmq::send_flags::dontwait);
      if (!sent) return absl::UnavailableError("peer's send queue is full");
    }
    const bool more = !msg.tensors.empty();
    auto sent =
        socket.send(zmq::buffer(header), more ? zmq::send_flags::sndmore | zmq::send_flags::dontwait
                                              : zmq::send_flags::dontwait);
    if (!sent) return absl::UnavailableError("send queue is full or no connection");
    for (size_t i = 0; i < msg.tensors.size(); ++i) {
      const std::vector<std::span<const std::byte>> chunks = wire::Chunks(msg.tensors[i].bytes);
      for (size_t c = 0; c < chunks.size(); ++c) {
        const bool last = i + 1 == msg.tensors.size() && c + 1 == chunks.size();
        zmq::message_t frame = ZeroCopyFrame(msg.tensors[i], chunks[c]);
        bytes += frame.size();
        socket.send(frame, last ? zmq::send_flags::dontwait
                                : zmq::send_flags::sndmore | zmq::send_flags::dontwait);
      }
    }
  } catch (const zmq::error_t& e) {
    if (e.num() == EHOSTUNREACH) return absl::NotFoundError("peer is not connected");
    return absl::UnavailableError(absl::StrCat("zmq send: ", e.what()));
  }
  return bytes;
}

int64_t SteadyNowMs() { return SteadyClock::Get()->NowMs(); }

// Attaches a socket monitor (zmq_socket_monitor) for `events` to `socket` and returns the PAIR
// socket its events arrive on. Handshake outcomes are only visible this way.
zmq::socket_t StartMonitor(zmq::context_t& context, zmq::socket_t& socket, int events,
                           const char* role) {
  static std::atomic<uint64_t> monitors{0};
  const std::string endpoint =
      absl::StrCat("inproc://huddle-", role, "-monitor-", monitors.fetch_add(1));
  if (zmq_socket_monitor(socket.handle(), endpoint.c_str(), events) != 0) throw zmq::error_t();
  zmq::socket_t monitor(context, zmq::socket_type::pair);
  monitor.set(zmq::sockopt::linger, 0);
  monitor.connect(endpoint);
  return monitor;
}

struct MonitorEvent {
  uint16_t id = 0;
  uint32_t value = 0;  // e.g. the ZMTP protocol error, or the ZAP status code
};

// The next queued monitor event, or nullopt when none is queued.
std::optional<MonitorEvent> NextMonitorEvent(zmq::socket_t& monitor) {
  while (true) {
    zmq::message_t event, address;
    if (!monitor.recv(event, zmq::recv_flags::dontwait)) return std::nullopt;
    if (event.more()) (void)monitor.recv(address, zmq::recv_flags::none);
    if (event.size() < 6) continue;
    MonitorEvent e;
    std::memcpy(&e.id, event.data(), 2);
    std::memcpy(&e.value, static_cast<const char*>(event.data()) + 2, 4);
    return e;
  }
}

// One multipart message as received, before decoding. The routing id (ROUTER side) is in
// `prefix`; at most max_frames frames are kept, the rest are drained.
struct RawMessage {
  std::string prefix;
  std::vector<wire::Frame> frames;
  std::optional<std::string> user_id;  // ZAP User-Id of the connection, when authenticated
  size_t bytes = 0;
  uint64_t wire_bytes = 0;  // what its frames took on the wire (WireBytes), the prefix excluded
  int source_fd = -1;       // the connection's socket (ZMQ_SRCFD), -1 if unknown
  bool too_many = false;
};

RawMessage RecvRaw(zmq::socket_t& socket, bool has_prefix, const wire::CodecLimits& limits,
                   bool curve = false) {
  RawMessage out;
  bool first = true;
  while (true) {
    auto msg = std::make_shared<zmq::message_t>();
    auto got = socket.recv(*msg, zmq::recv_flags::none);
    (void)got;  // a poll said readable; parts of a multipart message arrive together
    out.bytes += msg->size();
    const bool more = msg->more();
    if (first && has_prefix) {
      out.prefix.assign(static_cast<const char*>(msg->data()), msg->size());
    } else {
      out.wire_bytes += WireBytes(msg->size(), curve);
      if (out.source_fd < 0) out.source_fd = msg->get(ZMQ_SRCFD);
      if (!out.user_id) {
        // Set by the ZAP handler at the handshake; ZeroMQ attaches it to every message.
        if (const char* uid = zmq_msg_gets(msg->handle(), "User-Id"); uid != nullptr) {
          out.user_id = uid;
        }
      }
      if (out.frames.size() < limits.max_frames) {
        auto bytes =
            std::span<const std::byte>(static_cast<const std::byte*>(msg->data()), msg->size());
        out.frames.push_back(wire::Frame{msg, bytes});
      } else {
        out.too_many = true;
      }
    }
    first = false;
    if (!more) break;
  }
  return out;
}

StatusOr<wire::Message> DecodeRaw(const RawMessage& raw, const wire::CodecLimits& limits) {
  if (raw.too_many) {
    return absl::InvalidArgumentError(
        absl::StrCat("malformed message: more than ", limits.max_frames, " frames"));
  }
  return wire::Decode(raw.frames, limits);
}

void SetCommonOptions(zmq::socket_t& s, const ZmqOptions& o) {
  s.set(zmq::sockopt::maxmsgsize, o.max_frame_bytes);
  s.set(zmq::sockopt::sndhwm, o.send_hwm);
  s.set(zmq::sockopt::rcvhwm, o.recv_hwm);
}

Status RevokedError(const std::string& auth_id) {
  return absl::PermissionDeniedError(
      absl::StrCat("the key of client '", auth_id, "' was removed from the allow-list (revoked)"));
}

class ZmqServer final : public ServerTransport {
 public:
  explicit ZmqServer(const ZmqOptions& options)
      : options_(options),
        context_(options.io_threads),
        limiter_(options.max_messages_per_s, options.burst_messages),
        guard_(options_),
        handshake_log_("failed handshakes", options.log_period_ms),
        rate_log_("messages dropped by the rate limit", options.log_period_ms),
        wake_fd_(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {}

  Status Bind(const std::string& endpoint) {
    // Buffers of 128 KiB and more (every tensor frame) are mmap'ed, so freeing one returns it to
    // the system; glibc would otherwise raise the threshold after the first free and keep what a
    // cut connection held in its arenas.
    ::mallopt(M_MMAP_THRESHOLD, 128 * 1024);
    if (options_.curve_server) {
      // The ZAP handler must answer before the first handshake: without one, libzmq admits any
      // client key.
      ZapOptions zap = options_.curve_server->zap;
      zap.log_period_ms = options_.log_period_ms;
      HUDDLE_ASSIGN_OR_RETURN(zap_, ZapHandler::Start(context_, std::move(zap)));
    }
    try {
      socket_ = zmq::socket_t(context_, zmq::socket_type::router);
      SetCommonOptions(socket_, options_);
      socket_.set(zmq::sockopt::router_mandatory, 1);
      socket_.set(zmq::sockopt::linger, 2000);
      if (options_.curve_server) {
        const CurveKeyPair& k = options_.curve_server->server;
        socket_.set(zmq::sockopt::curve_server, 1);
        socket_.set(zmq::sockopt::curve_secretkey, k.secret_z85);
        socket_.set(zmq::sockopt::zap_domain, "huddle");
      }
      // Handshakes that fail before ZAP is asked (a client pinning another coordinator key, a
      // plaintext client) are only visible to the socket monitor, and so are the fds of the
      // connections (ConnectionGuard).
      monitor_ = StartMonitor(context_, socket_,
                              ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL | ZMQ_EVENT_ACCEPTED |
                                  ZMQ_EVENT_DISCONNECTED | ZMQ_EVENT_CLOSED,
                              "server");
    } catch (const zmq::error_t& e) {
      return absl::InvalidArgumentError(
          absl::StrCat("coordinator socket options for '", endpoint, "': ", e.what()));
    }
    try {
      socket_.bind(endpoint);
    } catch (const zmq::error_t& e) {
      const std::string text =
          absl::StrCat("cannot bind coordinator to '", endpoint, "': ", e.what());
      if (e.num() == EINVAL || e.num() == EPROTONOSUPPORT || e.num() == ENOCOMPATPROTO) {
        return absl::InvalidArgumentError(text);
      }
      return absl::UnavailableError(text);
    }
    return absl::OkStatus();
  }

  Status Send(const PeerId& peer, const wire::Message& msg) override {
    HUDDLE_ASSIGN_OR_RETURN(size_t n, SendFrames(socket_, &peer, msg));
    bytes_out_ += n;
    return absl::OkStatus();
  }

  StatusOr<std::optional<Inbound>> Receive(int64_t timeout_ms) override {
    const int64_t deadline = SteadyNowMs() + std::max<int64_t>(0, timeout_ms);
    zmq::pollitem_t items[] = {{socket_.handle(), 0, ZMQ_POLLIN, 0},
                               {monitor_.handle(), 0, ZMQ_POLLIN, 0},
                               {nullptr, wake_fd_, ZMQ_POLLIN, 0}};
    const int num_items = wake_fd_ >= 0 ? 3 : 2;
    try {
      while (true) {
        MaybeCheckConnections();
        if (!revoked_.empty()) {
          Inbound in = std::move(revoked_.front());
          revoked_.pop_front();
          return std::optional<Inbound>(std::move(in));
        }
        const int64_t now = SteadyNowMs();
        const int64_t wait = std::max<int64_t>(0, std::min(deadline, next_check_ms_) - now);
        zmq::poll(items, num_items, std::chrono::milliseconds(wait));
        if (items[1].revents & ZMQ_POLLIN) DrainMonitor();
        if (num_items == 3 && (items[2].revents & ZMQ_POLLIN)) {
          uint64_t wakes = 0;
          (void)::read(wake_fd_, &wakes, sizeof(wakes));  // resets the eventfd
          if (!(items[0].revents & ZMQ_POLLIN)) return std::optional<Inbound>();
        }
        if (!(items[0].revents & ZMQ_POLLIN)) {
          if (SteadyNowMs() >= deadline) return std::optional<Inbound>();
          continue;
        }
        RawMessage raw = RecvRaw(socket_, /*has_prefix=*/true, options_.codec,
                                 options_.curve_server.has_value());
        bytes_in_ += raw.bytes;
        std::optional<Inbound> in;
        if (guard_.OnDelivered(SteadyNowMs(),
                               {raw.source_fd, raw.prefix, raw.user_id, raw.wire_bytes})) {
          in = Admit(std::move(raw));
        }
        if (in) return in;
        if (SteadyNowMs() >= deadline) return std::optional<Inbound>();
      }
    } catch (const zmq::error_t& e) {
      if (e.num() == EINTR) return std::optional<Inbound>();
      return absl::InternalError(absl::StrCat("zmq receive: ", e.what()));
    }
  }

  uint64_t bytes_in() const override { return bytes_in_; }
  uint64_t bytes_out() const override { return bytes_out_; }
  bool authenticates() const override { return zap_ != nullptr; }
  uint64_t auth_rejections() const override {
    return (zap_ ? zap_->rejections() : 0) + unauthenticated_ + failed_handshakes_;
  }
  uint64_t rate_limited() const override { return rate_limited_; }
  uint64_t connections_cut() const override { return guard_.cut(); }
  void SetUploadAllowance(const PeerId& peer, size_t bytes) override {
    guard_.SetAllowance(peer, bytes);
  }

  void Wake() override {
    const uint64_t one = 1;
    if (wake_fd_ >= 0) (void)!::write(wake_fd_, &one, sizeof(one));
  }

  ~ZmqServer() override {
    if (socket_.handle() != nullptr) zmq_socket_monitor(socket_.handle(), nullptr, 0);
    if (wake_fd_ >= 0) ::close(wake_fd_);
  }

 private:
  // Every connection_check_ms: the monitor first (ends and fd reuse), then the connections that
  // may have changed since the last check (connection_guard.h, "What a check looks at").
  void MaybeCheckConnections() {
    const int64_t now = SteadyNowMs();
    if (now < next_check_ms_) return;
    next_check_ms_ = now + std::max<int64_t>(1, options_.connection_check_ms);
    DrainMonitor();
    // What closed or was cut before the last check, libzmq's I/O thread has freed by now: give
    // it back to the system (at most once a second: a trim walks the heap).
    if (trim_pending_ && now - last_trim_ms_ >= 1000) {
      ::malloc_trim(0);
      trim_pending_ = false;
      last_trim_ms_ = now;
    }
    std::vector<ConnectionGuard::Connection> revoked;
    trim_pending_ |= guard_.Check(
        now, zap_ ? zap_->generation() : 0,
        [&](const std::string& id) { return !zap_ || zap_->IsEnrolled(id); }, &revoked);
    // The coordinator learns of the revocation as it would from the connection's next message.
    for (const ConnectionGuard::Connection& c : revoked) {
      if (c.routing_id.empty()) continue;
      Inbound in;
      in.peer = c.routing_id;
      in.auth_id = c.auth_id;
      in.message = RevokedError(c.auth_id);
      revoked_.push_back(std::move(in));
    }
    handshake_log_.Flush(now);
    rate_log_.Flush(now);
  }

  void DrainMonitor() {
    while (std::optional<MonitorEvent> event = NextMonitorEvent(monitor_)) {
      const int fd = static_cast<int>(event->value);
      switch (event->id) {
        case ZMQ_EVENT_ACCEPTED:
          guard_.OnAccepted(fd);
          continue;
        case ZMQ_EVENT_DISCONNECTED:
        case ZMQ_EVENT_CLOSED:
          guard_.OnClosed(fd);
          trim_pending_ = true;
          continue;
        case ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL:
          break;
        default:
          continue;
      }
      const uint32_t value = event->value;
      failed_handshakes_++;
      handshake_log_.Add(SteadyNowMs(), std::to_string(value), [&] {
        const char* why =
            value == ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH
                ? "the peer does not use the same security mechanism (a --insecure client, or a "
                  "plaintext coordinator expected)"
            : value == ZMQ_PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC
                ? "its hello did not decrypt (a client pinning another coordinator's key)"
                : "protocol error";
        return absl::StrCat("refused a handshake: ", why, " (", failed_handshakes_,
                            " failed handshakes so far)");
      });
    }
  }

  // Rate limit, authentication, then decode. nullopt: dropped (counted, logged sparingly).
  std::optional<Inbound> Admit(RawMessage raw) {
    const bool identified = zap_ && raw.user_id && !raw.user_id->empty();
    const std::string& source = identified ? *raw.user_id : raw.prefix;
    if (!limiter_.Admit(source, SteadyNowMs())) {
      rate_limited_++;
      rate_log_.Add(SteadyNowMs(), source, [&] {
        return absl::StrCat("peer ", PeerName(raw.prefix),
                            identified ? " ('" + *raw.user_id + "')" : "", ": over ",
                            options_.max_messages_per_s, " messages/s; dropping its messages (",
                            rate_limited_, " dropped so far)");
      });
      return std::nullopt;
    }
    Inbound in;
    in.peer = std::move(raw.prefix);
    in.wire_bytes = raw.bytes;
    if (zap_) {
      if (!identified) {
        // Cannot happen while the ZAP handler runs (it sets a User-Id on every admitted
        // connection); refuse rather than trust an unauthenticated connection.
        unauthenticated_++;
        spdlog::error("peer {}: message without an authenticated identity; dropped",
                      PeerName(in.peer));
        return std::nullopt;
      }
      in.auth_id = *raw.user_id;
      if (!zap_->IsEnrolled(in.auth_id)) {
        in.message = RevokedError(in.auth_id);
        return in;
      }
    }
    in.message = DecodeRaw(raw, options_.codec);
    return in;
  }

  ZmqOptions options_;
  zmq::context_t context_;
  std::unique_ptr<ZapHandler> zap_;  // after context_, before socket_: outlives the socket
  zmq::socket_t socket_;
  zmq::socket_t monitor_;
  RateLimiter limiter_;
  ConnectionGuard guard_;
  std::deque<Inbound> revoked_;  // connections cut for revocation, not yet reported
  LogSummary handshake_log_;
  LogSummary rate_log_;
  int wake_fd_ = -1;  // an eventfd that Wake() signals; Receive polls it (-1: none)
  int64_t next_check_ms_ = 0;
  uint64_t bytes_in_ = 0;
  uint64_t bytes_out_ = 0;
  uint64_t rate_limited_ = 0;
  uint64_t unauthenticated_ = 0;
  uint64_t failed_handshakes_ = 0;
  bool trim_pending_ = false;  // connections closed or cut since the last malloc_trim
  int64_t last_trim_ms_ = 0;
};

class ZmqClient final : public ClientTransport {
 public:
  ZmqClient(std::string endpoint, const ZmqOptions& options)
      : endpoint_(std::move(endpoint)), options_(options), context_(options.io_threads) {}

  Status Connect() {
    try {
      socket_ = zmq::socket_t(context_, zmq::socket_type::dealer);
      SetCommonOptions(socket_, options_);
      socket_.set(zmq::sockopt::immediate, 1);
      socket_.set(zmq::sockopt::linger, 1000);
      socket_.set(zmq::sockopt::reconnect_ivl, options_.reconnect_ivl_ms);
      socket_.set(zmq::sockopt::reconnect_ivl_max, options_.reconnect_ivl_max_ms);
      if (options_.curve_client) {
        const CurveClientOptions& c = *options_.curve_client;
        socket_.set(zmq::sockopt::curve_serverkey, c.server_public_z85);
        socket_.set(zmq::sockopt::curve_publickey, c.client.public_z85);
        socket_.set(zmq::sockopt::curve_secretkey, c.client.secret_z85);
      }
      // Handshake outcomes come from the socket monitor: the only way to tell "refused" or
      // "wrong server key" from "not up yet".
      monitor_ =
          StartMonitor(context_, socket_,
                       ZMQ_EVENT_HANDSHAKE_SUCCEEDED | ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL |
                           ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL | ZMQ_EVENT_HANDSHAKE_FAILED_AUTH,
                       "client");
      socket_.connect(endpoint_);
    } catch (const zmq::error_t& e) {
      return absl::InvalidArgumentError(
          absl::StrCat("cannot connect to coordinator '", endpoint_, "': ", e.what()));
    }
    handshake_failures_ = 0;
    return absl::OkStatus();
  }

  Status Send(const wire::Message& msg) override {
    return SendFrames(socket_, nullptr, msg).status();
  }

  StatusOr<std::optional<StatusOr<wire::Message>>> Receive(int64_t timeout_ms) override {
    using Result = std::optional<StatusOr<wire::Message>>;
    if (retry_at_ms_ >= 0 && SteadyNowMs() >= retry_at_ms_) {
      retry_at_ms_ = -1;
      HUDDLE_RETURN_IF_ERROR(Reconnect());
    }
    if (retry_at_ms_ >= 0) timeout_ms = std::min(timeout_ms, retry_at_ms_ - SteadyNowMs());
    zmq::pollitem_t items[] = {{socket_.handle(), 0, ZMQ_POLLIN, 0},
                               {monitor_.handle(), 0, ZMQ_POLLIN, 0}};
    try {
      zmq::poll(items, 2, std::chrono::milliseconds(std::max<int64_t>(0, timeout_ms)));
      if (items[1].revents & ZMQ_POLLIN) HUDDLE_RETURN_IF_ERROR(DrainMonitor());
      if (!(items[0].revents & ZMQ_POLLIN)) return Result();
      RawMessage raw = RecvRaw(socket_, /*has_prefix=*/false, options_.codec);
      return Result(DecodeRaw(raw, options_.codec));
    } catch (const zmq::error_t& e) {
      if (e.num() == EINTR) return Result();
      return absl::InternalError(absl::StrCat("zmq receive: ", e.what()));
    }
  }

  std::string ConnectionProblem() const override { return problem_; }

  Status Reconnect() override {
    try {
      zmq_socket_monitor(socket_.handle(), nullptr, 0);
      monitor_.close();
      socket_.set(zmq::sockopt::linger, 0);
      socket_.close();
    } catch (const zmq::error_t& e) {
      spdlog::warn("closing the old connection: {}", e.what());
    }
    return Connect();
  }

  ~ZmqClient() override {
    if (socket_.handle() != nullptr) zmq_socket_monitor(socket_.handle(), nullptr, 0);
  }

 private:
  // Reads the monitor's handshake events. An error means this client cannot get in: the
  // coordinator refused its key, or handshakes keep failing (wrong pinned key, no encryption).
  Status DrainMonitor() {
    while (std::optional<MonitorEvent> event = NextMonitorEvent(monitor_)) {
      HUDDLE_RETURN_IF_ERROR(OnHandshakeEvent(event->id, event->value));
    }
    return absl::OkStatus();
  }

  Status OnHandshakeEvent(uint16_t id, uint32_t value) {
    const bool encrypted = options_.curve_client.has_value();
    const std::string mine =
        encrypted ? Fingerprint(options_.curve_client->client.public_z85) : std::string();
    const std::string pinned =
        encrypted ? Fingerprint(options_.curve_client->server_public_z85) : std::string();
    switch (id) {
      case ZMQ_EVENT_HANDSHAKE_SUCCEEDED:
        handshake_failures_ = 0;
        retry_delay_ms_ = options_.reconnect_ivl_ms;
        if (!problem_.empty())
          spdlog::info("the coordinator at {} accepted this client's key", endpoint_);
        problem_.clear();
        warned_refused_ = false;
        return absl::OkStatus();
      case ZMQ_EVENT_HANDSHAKE_FAILED_AUTH:
        if (value == kZapRetryLater) {
          // Too many handshakes from this key for now. libzmq does not reconnect after a refused
          // handshake, so this client does, backing off up to reconnect_ivl_max_ms.
          if (!warned_throttled_) {
            warned_throttled_ = true;
            spdlog::warn(
                "the coordinator at {} refused a handshake for now (too many handshakes from "
                "this client's key {}); retrying",
                endpoint_, mine);
          }
          retry_at_ms_ = SteadyNowMs() + retry_delay_ms_;
          retry_delay_ms_ = std::min(2 * retry_delay_ms_, options_.reconnect_ivl_max_ms);
          return absl::OkStatus();
        }
        if (options_.refused_retry_max_ms > 0) {
          // Not enrolled (yet): the operator may be adding the key right now, and the coordinator
          // picks an enrolment up at once. Retry, backing off, and say so once.
          problem_ = absl::StrCat("the coordinator at ", endpoint_, " refused this client's key ",
                                  mine, " (not enrolled, or revoked)");
          if (!warned_refused_) {
            warned_refused_ = true;
            spdlog::warn(
                "{}; retrying with backoff (up to every {} s) until its operator enrols it: the "
                "client's .pub file in the coordinator's allow-list",
                problem_, options_.refused_retry_max_ms / 1000.0);
          }
          retry_at_ms_ = SteadyNowMs() + retry_delay_ms_;
          retry_delay_ms_ = static_cast<int>(
              std::min<int64_t>(2 * int64_t{retry_delay_ms_}, options_.refused_retry_max_ms));
          return absl::OkStatus();
        }
        return absl::PermissionDeniedError(absl::StrCat(
            "the coordinator at ", endpoint_, " refused this client's key ", mine, " (ZAP status ",
            value,
            "): it is not enrolled, or was revoked. Send the client's .pub file to the "
            "coordinator's operator to be added to its allow-list"));
      case ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL:
        if (value == ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH) {
          return absl::FailedPreconditionError(absl::StrCat(
              "the coordinator at ", endpoint_, " and this client disagree on encryption: ",
              encrypted ? "the coordinator runs without it (--insecure)"
                        : "the coordinator requires it; configure its public key "
                          "(security.server_public_key) and this client's key pair instead of "
                          "--insecure"));
        }
        [[fallthrough]];
      case ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL:
        if (++handshake_failures_ >= options_.handshake_failures_before_error) {
          return absl::UnauthenticatedError(absl::StrCat(
              "could not establish a session with the coordinator at ", endpoint_, " (",
              handshake_failures_, " handshakes failed in a row): ",
              encrypted
                  ? absl::StrCat("the pinned coordinator key ", pinned,
                                 " is most likely not this coordinator's key (check "
                                 "security.server_public_key), or the coordinator runs without "
                                 "encryption (--insecure)")
                  : "the coordinator most likely requires encryption (it was not started with "
                    "--insecure): pass its public key (--server-key) and this client's key pair "
                    "(--key) instead of --insecure"));
        }
        return absl::OkStatus();
      default:
        return absl::OkStatus();
    }
  }

  std::string endpoint_;
  ZmqOptions options_;
  zmq::context_t context_;
  zmq::socket_t socket_;
  zmq::socket_t monitor_;
  int handshake_failures_ = 0;
  bool warned_throttled_ = false;
  bool warned_refused_ = false;
  std::string problem_;       // why handshakes are refused, until one succeeds
  int64_t retry_at_ms_ = -1;  // when to reconnect after a handshake refused for now; -1: none
  int retry_delay_ms_ = options_.reconnect_ivl_ms;
};

}  // namespace

StatusOr<std::unique_ptr<ServerTransport>> BindZmqServer(const std::string& endpoint,
                                                         const ZmqOptions& options) {
  auto server = std::make_unique<ZmqServer>(options);
  HUDDLE_RETURN_IF_ERROR(server->Bind(endpoint));
  return std::unique_ptr<ServerTransport>(std::move(server));
}

StatusOr<std::unique_ptr<ClientTransport>> ConnectZmqClient(const std::string& endpoint,
                                                            const ZmqOptions& options) {
  auto client = std::make_unique<ZmqClient>(endpoint, options);
  HUDDLE_RETURN_IF_ERROR(client->Connect());
  return std::unique_ptr<ClientTransport>(std::move(client));
}

std::string PeerName(const PeerId& peer) {
  bool printable = !peer.empty();
  for (unsigned char c : peer) printable &= (c >= 0x21 && c < 0x7f);
  if (printable) return peer;
  static const char* kHex = "0123456789abcdef";
  std::string out = "0x";
  for (unsigned char c : peer) {
    out.push_back(kHex[c >> 4]);
    out.push_back(kHex[c & 15]);
  }
  return out;
}

}  // namespace huddle::transport
