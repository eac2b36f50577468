// The ZeroMQ transport's client side (ConnectZmqClient, zmq_transport.h): a DEALER to the
// coordinator.
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <vector>
#include <zmq.hpp>

#include "common/clock.h"
#include "common/logging.h"
#include "transport/zmq_socket.h"
#include "transport/zmq_transport.h"

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

StatusOr<std::unique_ptr<ClientTransport>> ConnectZmqClient(const std::string& endpoint,
                                                            const ZmqOptions& options) {
  auto client = std::make_unique<ZmqClient>(endpoint, options);
  HUDDLE_RETURN_IF_ERROR(client->Connect());
  return std::unique_ptr<ClientTransport>(std::move(client));
}

}  // namespace huddle::transport
