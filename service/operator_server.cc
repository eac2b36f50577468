#include "service/operator_server.h"

#include <spdlog/spdlog.h>

#include <chrono>
#include <cstring>
#include <thread>
#include <zmq.hpp>

#include "common/clock.h"
#include "transport/rate_limiter.h"

namespace huddle::service {
namespace {

int64_t NowMs() { return SteadyClock::Get()->NowMs(); }

bool IsLocalEndpoint(const std::string& e) {
  return e.rfind("ipc://", 0) == 0 || e.rfind("tcp://127.", 0) == 0 ||
         e.rfind("tcp://localhost:", 0) == 0 || e.rfind("tcp://[::1]:", 0) == 0;
}

std::string ErrorReply(const std::string& text) {
  std::string escaped;
  for (char c : text) {
    if (c == '"' || c == '\\') escaped += '\\';
    if (static_cast<unsigned char>(c) >= 0x20) escaped += c;
  }
  return "{\"ok\":false,\"error\":\"" + escaped + "\"}";
}

}  // namespace

struct OperatorServer::Impl {
  OperatorServerOptions options;
  OperatorHandler handler;
  zmq::context_t context{1};
  std::unique_ptr<transport::ZapHandler> zap;  // after context, before socket
  zmq::socket_t socket;
};

OperatorServer::OperatorServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

StatusOr<std::unique_ptr<OperatorServer>> OperatorServer::Start(OperatorServerOptions options,
                                                                OperatorHandler handler) {
  if (!options.server_key && !IsLocalEndpoint(options.bind)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the operators' endpoint ", options.bind,
        " is not a loopback or ipc:// address: without keys (--insecure) it must be, or anyone "
        "who reaches it could submit and stop jobs"));
  }
  auto impl = std::make_unique<Impl>();
  impl->options = std::move(options);
  impl->handler = std::move(handler);
  const OperatorServerOptions& o = impl->options;
  if (o.server_key) {
    HUDDLE_ASSIGN_OR_RETURN(impl->zap, transport::ZapHandler::Start(impl->context, o.zap));
  }
  std::string endpoint;
  try {
    impl->socket = zmq::socket_t(impl->context, zmq::socket_type::router);
    impl->socket.set(zmq::sockopt::linger, 0);
    impl->socket.set(zmq::sockopt::maxmsgsize, static_cast<int64_t>(o.max_request_bytes));
    impl->socket.set(zmq::sockopt::router_mandatory, 1);
    impl->socket.set(zmq::sockopt::sndhwm, 64);
    impl->socket.set(zmq::sockopt::rcvhwm, 64);
    if (o.server_key) {
      impl->socket.set(zmq::sockopt::curve_server, 1);
      impl->socket.set(zmq::sockopt::curve_secretkey, o.server_key->secret_z85);
      impl->socket.set(zmq::sockopt::zap_domain, "huddle-operators");
    }
    impl->socket.bind(o.bind);
    endpoint = impl->socket.get(zmq::sockopt::last_endpoint);
  } catch (const zmq::error_t& e) {
    return absl::UnavailableError(
        absl::StrCat("cannot bind the operators' endpoint ", o.bind, ": ", e.what()));
  }
  std::unique_ptr<OperatorServer> server(new OperatorServer(std::move(impl)));
  server->endpoint_ = endpoint;
  server->thread_ = std::thread([s = server.get()] { s->Serve(); });
  return server;
}

OperatorServer::~OperatorServer() {
  stopping_.store(true);
  if (thread_.joinable()) thread_.join();
}

void OperatorServer::Serve() {
  zmq::socket_t& socket = impl_->socket;
  transport::RateLimiter limiter(impl_->options.max_requests_per_s, impl_->options.burst_requests);
  while (!stopping_.load()) {
    try {
      zmq::pollitem_t item{socket.handle(), 0, ZMQ_POLLIN, 0};
      zmq::poll(&item, 1, std::chrono::milliseconds(100));
      if (!(item.revents & ZMQ_POLLIN)) continue;
      zmq::message_t routing, request;
      if (!socket.recv(routing, zmq::recv_flags::dontwait)) continue;
      bool well_formed = routing.more() && socket.recv(request, zmq::recv_flags::none).has_value();
      while (request.more()) {  // one frame per request: drain the rest
        zmq::message_t extra;
        (void)socket.recv(extra, zmq::recv_flags::none);
        well_formed = false;
        if (!extra.more()) break;
      }
      std::string operator_id = "insecure";
      if (impl_->zap) {
        const char* uid = zmq_msg_gets(request.handle(), "User-Id");
        if (uid == nullptr) continue;  // cannot happen with the ZAP handler running
        operator_id = uid;
      }
      std::string reply;
      if (!well_formed) {
        reply = ErrorReply("a request is one frame");
      } else if (!limiter.Admit(operator_id, NowMs())) {
        reply = ErrorReply("too many requests from this operator; retry in a second");
      } else {
        reply = impl_->handler(operator_id, request.to_string());
      }
      socket.send(routing, zmq::send_flags::sndmore);
      socket.send(zmq::buffer(reply), zmq::send_flags::dontwait);
    } catch (const zmq::error_t& e) {
      if (e.num() == ETERM) return;
      if (e.num() != EINTR && e.num() != EHOSTUNREACH && e.num() != EAGAIN) {
        spdlog::warn("operators' endpoint: {}", e.what());
      }
    }
  }
}

namespace {

// One attempt; Unavailable with "retry" when the service refused the handshake for now (too many
// from this key), which the caller retries.
StatusOr<std::string> TryRequest(const OperatorClientOptions& options, const std::string& request,
                                 int64_t deadline) {
  zmq::context_t context(1);
  try {
    zmq::socket_t socket(context, zmq::socket_type::dealer);
    socket.set(zmq::sockopt::linger, 0);
    if (options.key) {
      socket.set(zmq::sockopt::curve_serverkey, options.server_public_z85);
      socket.set(zmq::sockopt::curve_publickey, options.key->public_z85);
      socket.set(zmq::sockopt::curve_secretkey, options.key->secret_z85);
    }
    const std::string monitor_endpoint = "inproc://huddle-operator-monitor";
    if (zmq_socket_monitor(socket.handle(), monitor_endpoint.c_str(),
                           ZMQ_EVENT_HANDSHAKE_FAILED_AUTH | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                               ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL) != 0) {
      return absl::InternalError("cannot monitor the operator connection");
    }
    zmq::socket_t monitor(context, zmq::socket_type::pair);
    monitor.connect(monitor_endpoint);
    socket.connect(options.endpoint);
    socket.send(zmq::buffer(request), zmq::send_flags::none);
    while (NowMs() < deadline) {
      zmq::pollitem_t items[] = {{socket.handle(), 0, ZMQ_POLLIN, 0},
                                 {monitor.handle(), 0, ZMQ_POLLIN, 0}};
      zmq::poll(items, 2, std::chrono::milliseconds(std::max<int64_t>(1, deadline - NowMs())));
      if (items[1].revents & ZMQ_POLLIN) {
        zmq::message_t event;
        if (monitor.recv(event, zmq::recv_flags::dontwait) && event.size() >= 6) {
          uint16_t id = 0;
          uint32_t value = 0;
          std::memcpy(&id, event.data(), sizeof(id));
          std::memcpy(&value, static_cast<const char*>(event.data()) + 2, sizeof(value));
          zmq_socket_monitor(socket.handle(), nullptr, 0);
          if (id == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH && value == transport::kZapRetryLater) {
            return absl::UnavailableError("retry");
          }
          if (id == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH) {
            return absl::PermissionDeniedError(
                absl::StrCat("the service at ", options.endpoint,
                             " refused this key: it is not enrolled in the service's operators' "
                             "allow-list (security.operators, operator .pub files from `huddle "
                             "keygen operator`), or it is also a client's key, which can never "
                             "act as an operator"));
          }
          return absl::UnauthenticatedError(absl::StrCat(
              "could not establish a session with the service at ", options.endpoint,
              ": check the service's public key (--server-key) or whether it runs with keys"));
        }
      }
      if (items[0].revents & ZMQ_POLLIN) {
        zmq::message_t reply;
        (void)socket.recv(reply, zmq::recv_flags::none);
        zmq_socket_monitor(socket.handle(), nullptr, 0);
        return reply.to_string();
      }
    }
    zmq_socket_monitor(socket.handle(), nullptr, 0);
  } catch (const zmq::error_t& e) {
    return absl::UnavailableError(
        absl::StrCat("operator request to ", options.endpoint, ": ", e.what()));
  }
  return absl::DeadlineExceededError(absl::StrCat("the service at ", options.endpoint,
                                                  " did not answer within ",
                                                  options.timeout_ms / 1000, " s"));
}

}  // namespace

StatusOr<std::string> OperatorRequest(const OperatorClientOptions& options,
                                      const std::string& request) {
  const int64_t deadline = NowMs() + options.timeout_ms;
  while (true) {
    StatusOr<std::string> reply = TryRequest(options, request, deadline);
    if (reply.ok() || !absl::IsUnavailable(reply.status()) || reply.status().message() != "retry") {
      return reply;
    }
    if (NowMs() + 500 >= deadline) {
      return absl::UnavailableError(absl::StrCat(
          "the service at ", options.endpoint,
          " refused this key's handshakes for now (too many in a short time); retry later"));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
}

}  // namespace huddle::service
