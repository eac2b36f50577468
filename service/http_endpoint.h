// The HTTP endpoint of `huddle serve` for Prometheus and for probes: GET /metrics, /healthz and
// /readyz, nothing else. Built on libmicrohttpd, chosen because it bounds what a hostile client
// can cost the service:
//   - its own polling thread(s), `threads` of them, fixed: no thread per connection;
//   - at most `connection_limit` connections in all and `per_ip_connection_limit` from one address
//     (connections beyond are accepted and closed at once);
//   - a connection idle for `connection_timeout_s` is closed, so idle connections free their
//     slots; note that this is an idle timeout: a client that trickles a byte at a time keeps its
//     slot (at most per_ip_connection_limit of them per address);
//   - `connection_memory_limit_bytes` per connection for the request line and headers (a request
//     that does not fit is answered 431/413 and closed);
//   - only GET and HEAD (405 with `Allow: GET, HEAD` otherwise); a request with a body is answered
//     413 before the body is read; paths other than the three answer 404 (query strings ignored).
// The default bind is loopback (127.0.0.1:9464); binding another address exposes the metrics and
// the probes to that network without authentication: the metrics must then carry only what may be
// public (design.md: only DP-protected values under DP).
//
// Answers:
//   /metrics  200 with handlers.metrics()'s text, Content-Type
//             "text/plain; version=0.0.4; charset=utf-8"; 500 with the error's message (one line)
//             when it returns an error; 404 when no metrics handler is set.
//   /healthz  200 "ok" while the process serves at all (liveness); with handlers.healthy set, 200
//             or 503 with its one-line reason.
//   /readyz   200 "ready" or 503 with handlers.ready's one-line reason ("not ready" by default);
//             without handlers.ready, always 200.
// Text answers are one line, text/plain; control characters in a reason become spaces and it is
// cut to 200 bytes.
//
// Thread-safety: the handlers are called on the endpoint's thread(s), concurrently with the rest
// of the program and, when threads > 1, with each other: they must be thread-safe. They should be
// quick (a slow handler stalls every connection of its thread) and must not throw (an exception is
// answered 500 and logged). The destructor stops the endpoint: it waits for a handler in progress
// to return, closes every connection, and no handler is called after it returns; the handlers'
// captured state must outlive the endpoint. port() and bind_address() may be called from any
// thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "common/status.h"

namespace huddle::service {

struct HttpEndpointOptions {
  // HOST:PORT. HOST: an IPv4 literal ("127.0.0.1", "0.0.0.0"), "localhost" (127.0.0.1, never
  // resolved), or an IPv6 literal in brackets ("[::1]"). PORT: 0-65535; 0 picks a free port (see
  // HttpEndpoint::port()).
  std::string bind = "127.0.0.1:9464";
  // Connections open at once, in all and from one client address.
  unsigned connection_limit = 16;
  unsigned per_ip_connection_limit = 4;
  // A connection without traffic for this long is closed (seconds, >= 1).
  unsigned connection_timeout_s = 5;
  // Memory for one connection's request line, headers and response headers (bytes, >= 4096).
  size_t connection_memory_limit_bytes = 32 * 1024;
  // Polling threads (1 or 2; more would be spent on probes, not on training). With 2, the
  // connection limit is shared between them.
  unsigned threads = 1;
};

// Where the answers come from; each may be empty (see the file comment for the defaults).
struct HttpHandlers {
  // The body of /metrics: a Prometheus exposition (service/prometheus.h's Render()).
  std::function<StatusOr<std::string>()> metrics;
  // Liveness and readiness: true when healthy / ready; otherwise sets *reason (one line).
  std::function<bool(std::string* reason)> healthy;
  std::function<bool(std::string* reason)> ready;
};

class HttpEndpoint {
 public:
  // Parses options.bind, binds and starts serving. InvalidArgument naming the bind for a bad
  // address or option; Unavailable naming it when it cannot be bound ("... 127.0.0.1:9464: Address
  // already in use").
  static StatusOr<std::unique_ptr<HttpEndpoint>> Start(HttpEndpointOptions options,
                                                       HttpHandlers handlers);
  ~HttpEndpoint();
  HttpEndpoint(const HttpEndpoint&) = delete;
  HttpEndpoint& operator=(const HttpEndpoint&) = delete;

  // The port bound (the chosen one when options.bind asked for port 0).
  uint16_t port() const;
  // HOST:PORT as bound, e.g. "127.0.0.1:40123" or "[::1]:9464".
  const std::string& bind_address() const;

 private:
  struct Impl;
  explicit HttpEndpoint(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The parsed form of HttpEndpointOptions::bind, exposed for tests and for the config's checks.
struct BindAddress {
  bool ipv6 = false;
  std::string host;  // the literal, without brackets ("localhost" becomes "127.0.0.1")
  uint16_t port = 0;
};
StatusOr<BindAddress> ParseBindAddress(std::string_view bind);

}  // namespace huddle::service
