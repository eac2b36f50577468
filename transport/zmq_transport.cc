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
#include "transport/zmq_socket.h"

namespace huddle::transport {
namespace {

using zmq_internal::DecodeRaw;
using zmq_internal::MonitorEvent;
using zmq_internal::NextMonitorEvent;
using zmq_internal::RawMessage;
using zmq_internal::RecvRaw;
using zmq_internal::SendFrames;
using zmq_internal::SetCommonOptions;
using zmq_internal::StartMonitor;
using zmq_internal::SteadyNowMs;

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
        if (guard_.OnDelivered(SteadyNowMs(), {raw.source_fd, raw.prefix, raw.user_id,
                                               raw.wire_bytes, raw.auth_key})) {
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
        [&](const std::string& id, const std::string& key) {
          return !zap_ || zap_->IsEnrolled(id, key);
        },
        &revoked);
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
      if (!zap_->IsEnrolled(in.auth_id, raw.auth_key)) {
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

}  // namespace

StatusOr<std::unique_ptr<ServerTransport>> BindZmqServer(const std::string& endpoint,
                                                         const ZmqOptions& options) {
  auto server = std::make_unique<ZmqServer>(options);
  HUDDLE_RETURN_IF_ERROR(server->Bind(endpoint));
  return std::unique_ptr<ServerTransport>(std::move(server));
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
