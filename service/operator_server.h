// The operators' endpoint of `huddle serve`: authenticated requests, one JSON document each way.
//
// A ZeroMQ ROUTER of its own (its own context, so its own ZAP handler and allow-list): only keys
// enrolled in the operators' allow-list complete the CurveZMQ handshake, and a client key, which
// is enrolled only in the clients' list, never can. The operator's id (its key's enrolled id) comes
// from the handshake, not from the request. Each request is one frame of at most
// max_request_bytes (a job YAML fits), answered with one frame; at most max_requests_per_s per
// operator key (refused with an error beyond), handled one at a time on the server's thread.
// docs/protocol.md lists the requests.
//
// Without keys (--insecure) the endpoint must be a loopback or ipc:// address, and every request
// is the operator "insecure".
//
// Thread-safety: the handler runs on the server's own thread.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "common/status.h"
#include "transport/curve_keys.h"
#include "transport/zap_handler.h"

namespace huddle::service {

struct OperatorServerOptions {
  std::string bind = "tcp://127.0.0.1:5556";
  std::optional<transport::CurveKeyPair> server_key;  // none: plaintext (loopback/ipc only)
  transport::ZapOptions zap;                          // the operators' allow-list
  size_t max_request_bytes = size_t{2} << 20;
  double max_requests_per_s = 20;  // per operator
  double burst_requests = 40;
};

// Answers one request (`operator_id`, the request's JSON text) with the reply's JSON text.
using OperatorHandler =
    std::function<std::string(const std::string& operator_id, const std::string& request)>;

class OperatorServer {
 public:
  // Binds and starts serving; InvalidArgument/Unavailable naming the endpoint when it cannot.
  static StatusOr<std::unique_ptr<OperatorServer>> Start(OperatorServerOptions options,
                                                         OperatorHandler handler);
  ~OperatorServer();
  OperatorServer(const OperatorServer&) = delete;
  OperatorServer& operator=(const OperatorServer&) = delete;

  // The endpoint as bound (a tcp:// port 0 resolved).
  const std::string& endpoint() const { return endpoint_; }

 private:
  struct Impl;
  explicit OperatorServer(std::unique_ptr<Impl> impl);
  void Serve();

  std::unique_ptr<Impl> impl_;
  std::string endpoint_;
  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

// The client side, for `huddle submit` and the other operator commands: one request, its reply,
// within `timeout_ms`. `server_public_z85` and `key` absent: plaintext.
struct OperatorClientOptions {
  std::string endpoint;
  std::string server_public_z85;
  std::optional<transport::CurveKeyPair> key;
  int64_t timeout_ms = 10'000;
};
StatusOr<std::string> OperatorRequest(const OperatorClientOptions& options,
                                      const std::string& request);

}  // namespace huddle::service
