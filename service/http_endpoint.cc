#include "service/http_endpoint.h"

#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <charconv>
#include <cstdarg>
#include <cstring>
#include <exception>
#include <mutex>

#include "service/prometheus.h"
#include "spdlog/spdlog.h"

namespace huddle::service {

namespace {

// What libmicrohttpd's callbacks see (their `cls`).
struct EndpointState {
  HttpEndpointOptions options;
  HttpHandlers handlers;
  // libmicrohttpd's messages while Start() runs, to explain a failure to start.
  std::mutex start_log_mu;
  std::atomic<bool> starting{true};
  std::string start_log;
};

absl::string_view Absl(std::string_view s) { return absl::string_view(s.data(), s.size()); }

constexpr size_t kMaxReasonBytes = 200;
constexpr char kTextContentType[] = "text/plain; charset=utf-8";

// One line of at most kMaxReasonBytes (not cutting a UTF-8 sequence), control characters as spaces.
std::string OneLine(std::string text) {
  if (text.size() > kMaxReasonBytes) {
    size_t cut = kMaxReasonBytes;
    while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;
    text.resize(cut);
  }
  for (char& c : text) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7F) c = ' ';
  }
  return text + "\n";
}

MHD_Result Answer(MHD_Connection* connection, unsigned status, const std::string& body,
                  const char* content_type = kTextContentType) {
  MHD_Response* response = MHD_create_response_from_buffer(
      body.size(), const_cast<char*>(body.data()), MHD_RESPMEM_MUST_COPY);
  if (response == nullptr) return MHD_NO;  // out of memory: MHD closes the connection
  MHD_add_response_header(response, MHD_HTTP_HEADER_CONTENT_TYPE, content_type);
  if (status == MHD_HTTP_METHOD_NOT_ALLOWED) {
    MHD_add_response_header(response, MHD_HTTP_HEADER_ALLOW, "GET, HEAD");
  }
  const MHD_Result result = MHD_queue_response(connection, status, response);
  MHD_destroy_response(response);
  return result;
}

// A probe: 200 `ok_text` when `check` is empty or passes, else 503 with its reason.
MHD_Result Probe(MHD_Connection* connection, const std::function<bool(std::string*)>& check,
                 const char* ok_text, const char* failed_text) {
  std::string reason;
  if (!check || check(&reason)) return Answer(connection, MHD_HTTP_OK, OneLine(ok_text));
  return Answer(connection, MHD_HTTP_SERVICE_UNAVAILABLE,
                OneLine(reason.empty() ? failed_text : reason));
}

MHD_Result Route(const HttpHandlers& handlers, MHD_Connection* connection, std::string_view url) {
  if (url == "/metrics") {
    if (!handlers.metrics) return Answer(connection, MHD_HTTP_NOT_FOUND, OneLine("not found"));
    StatusOr<std::string> body = handlers.metrics();
    if (!body.ok()) {
      spdlog::warn("http endpoint: /metrics failed: {}", body.status());
      return Answer(connection, MHD_HTTP_INTERNAL_SERVER_ERROR,
                    OneLine(std::string(body.status().message())));
    }
    return Answer(connection, MHD_HTTP_OK, *body, kPrometheusContentType);
  }
  if (url == "/healthz") return Probe(connection, handlers.healthy, "ok", "unhealthy");
  if (url == "/readyz") return Probe(connection, handlers.ready, "ready", "not ready");
  return Answer(connection, MHD_HTTP_NOT_FOUND, OneLine("not found"));
}

// libmicrohttpd's access handler, called for a request once its headers are in, then again once
// its (here always empty) body is. A refusal (method, body) is answered from the first call, before
// any body is read, and closes the connection; an accepted request is answered from the second,
// which keeps the connection alive for the scraper's next request.
MHD_Result HandleRequest(void* cls, MHD_Connection* connection, const char* url, const char* method,
                         const char* /*version*/, const char* /*upload_data*/,
                         size_t* upload_data_size, void** request_state) {
  if (*request_state == nullptr) {
    *request_state = cls;
    if (std::strcmp(method, MHD_HTTP_METHOD_GET) != 0 &&
        std::strcmp(method, MHD_HTTP_METHOD_HEAD) != 0) {
      return Answer(connection, MHD_HTTP_METHOD_NOT_ALLOWED, OneLine("only GET and HEAD"));
    }
    const char* length =
        MHD_lookup_connection_value(connection, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    const char* encoding =
        MHD_lookup_connection_value(connection, MHD_HEADER_KIND, MHD_HTTP_HEADER_TRANSFER_ENCODING);
    if (encoding != nullptr || (length != nullptr && std::strcmp(length, "0") != 0)) {
      return Answer(connection, MHD_HTTP_CONTENT_TOO_LARGE, OneLine("request bodies are refused"));
    }
    return MHD_YES;
  }
  if (*upload_data_size != 0) return MHD_NO;  // a body after all: close the connection
  const auto* state = static_cast<const EndpointState*>(cls);
  try {
    return Route(state->handlers, connection, url);
  } catch (const std::exception& e) {
    spdlog::error("http endpoint: handler for {} threw: {}", url, e.what());
  } catch (...) {
    spdlog::error("http endpoint: handler for {} threw", url);
  }
  return Answer(connection, MHD_HTTP_INTERNAL_SERVER_ERROR, OneLine("internal error"));
}

// libmicrohttpd's messages (one per refused connection under a flood, so at debug level); while
// Start() runs they are also kept to explain a failure.
void LogMessage(void* cls, const char* format, va_list args) {
  char buffer[512];
  const int n = std::vsnprintf(buffer, sizeof(buffer), format, args);
  if (n <= 0) return;
  std::string_view message(buffer, std::min(static_cast<size_t>(n), sizeof(buffer) - 1));
  while (!message.empty() && (message.back() == '\n' || message.back() == ' ')) {
    message.remove_suffix(1);
  }
  auto* state = static_cast<EndpointState*>(cls);
  spdlog::debug("http endpoint {}: libmicrohttpd: {}", state->options.bind, message);
  if (state->starting.load()) {
    std::lock_guard<std::mutex> lock(state->start_log_mu);
    absl::StrAppend(&state->start_log, state->start_log.empty() ? "" : "; ", Absl(message));
  }
}

std::string HostPort(const BindAddress& address, uint16_t port) {
  return address.ipv6 ? absl::StrCat("[", address.host, "]:", port)
                      : absl::StrCat(address.host, ":", port);
}

// The address to bind, as a sockaddr_in or sockaddr_in6 (`storage`), and its length.
socklen_t ToSockaddr(const BindAddress& address, sockaddr_storage* storage) {
  std::memset(storage, 0, sizeof(*storage));
  if (address.ipv6) {
    auto* in6 = reinterpret_cast<sockaddr_in6*>(storage);
    in6->sin6_family = AF_INET6;
    in6->sin6_port = htons(address.port);
    inet_pton(AF_INET6, address.host.c_str(), &in6->sin6_addr);
    return sizeof(sockaddr_in6);
  }
  auto* in4 = reinterpret_cast<sockaddr_in*>(storage);
  in4->sin_family = AF_INET;
  in4->sin_port = htons(address.port);
  inet_pton(AF_INET, address.host.c_str(), &in4->sin_addr);
  return sizeof(sockaddr_in);
}

// Why `address` cannot be bound, by trying to bind it the way libmicrohttpd does; "" if it can.
std::string ProbeBind(const BindAddress& address) {
  sockaddr_storage storage;
  const socklen_t length = ToSockaddr(address, &storage);
  const int fd = socket(address.ipv6 ? AF_INET6 : AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return std::strerror(errno);
  const int on = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on));
  std::string reason;
  if (bind(fd, reinterpret_cast<const sockaddr*>(&storage), length) != 0) {
    reason = std::strerror(errno);
  }
  close(fd);
  return reason;
}

Status ValidateOptions(const HttpEndpointOptions& o) {
  std::string problem;
  if (o.connection_limit < 1) problem = "connection_limit must be >= 1";
  if (o.per_ip_connection_limit < 1) problem = "per_ip_connection_limit must be >= 1";
  if (o.connection_timeout_s < 1) problem = "connection_timeout_s must be >= 1";
  if (o.connection_memory_limit_bytes < 4096) problem = "connection_memory_limit_bytes < 4096";
  if (o.threads < 1 || o.threads > 2) problem = "threads must be 1 or 2";
  if (problem.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("http endpoint ", o.bind, ": ", problem));
}

}  // namespace

struct HttpEndpoint::Impl {
  EndpointState state;
  std::string bind_address;  // as bound, port resolved
  uint16_t port = 0;
  MHD_Daemon* daemon = nullptr;
};

StatusOr<BindAddress> ParseBindAddress(std::string_view bind) {
  auto invalid = [&](std::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("http endpoint bind '", Absl(bind), "': ", Absl(why),
                     " (expected HOST:PORT, HOST an IPv4 literal, localhost or [IPv6 literal])"));
  };
  const size_t colon = bind.rfind(':');
  if (colon == std::string_view::npos) return invalid("no ':PORT'");
  std::string_view host = bind.substr(0, colon);
  const std::string_view port_text = bind.substr(colon + 1);
  unsigned port = 0;
  const auto [end, error] =
      std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
  if (port_text.empty() || error != std::errc() || end != port_text.data() + port_text.size() ||
      port > 65535) {
    return invalid("the port is not a number from 0 to 65535");
  }
  BindAddress address;
  address.port = static_cast<uint16_t>(port);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    address.ipv6 = true;
    host = host.substr(1, host.size() - 2);
  }
  address.host = host == "localhost" ? "127.0.0.1" : std::string(host);
  unsigned char parsed[sizeof(in6_addr)];
  if (inet_pton(address.ipv6 ? AF_INET6 : AF_INET, address.host.c_str(), parsed) != 1) {
    return invalid(address.ipv6 ? "the host is not an IPv6 literal"
                                : "the host is not an IPv4 literal nor localhost");
  }
  return address;
}

HttpEndpoint::HttpEndpoint(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

HttpEndpoint::~HttpEndpoint() {
  if (impl_->daemon != nullptr) MHD_stop_daemon(impl_->daemon);
}

uint16_t HttpEndpoint::port() const { return impl_->port; }
const std::string& HttpEndpoint::bind_address() const { return impl_->bind_address; }

StatusOr<std::unique_ptr<HttpEndpoint>> HttpEndpoint::Start(HttpEndpointOptions options,
                                                            HttpHandlers handlers) {
  HUDDLE_ASSIGN_OR_RETURN(const BindAddress address, ParseBindAddress(options.bind));
  HUDDLE_RETURN_IF_ERROR(ValidateOptions(options));
  auto impl = std::make_unique<Impl>();
  EndpointState& state = impl->state;
  state.options = std::move(options);
  state.handlers = std::move(handlers);
  const HttpEndpointOptions& o = state.options;

  sockaddr_storage storage;
  ToSockaddr(address, &storage);
  unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_AUTO | MHD_USE_ERROR_LOG;
  if (address.ipv6) flags |= MHD_USE_IPv6;
  // The thread pool's size only where there is a pool (an empty array is a no-op).
  MHD_OptionItem pool_option[] = {{o.threads > 1 ? MHD_OPTION_THREAD_POOL_SIZE : MHD_OPTION_END,
                                   static_cast<intptr_t>(o.threads), nullptr},
                                  {MHD_OPTION_END, 0, nullptr}};
  // The listen backlog is as deep as the connection limit: a flood of connects waits in the
  // clients' SYN retransmissions, not in this process.
  // clang-format off
  impl->daemon = MHD_start_daemon(
      flags, address.port, nullptr, nullptr, &HandleRequest, &state,
      MHD_OPTION_EXTERNAL_LOGGER, &LogMessage, &state,
      MHD_OPTION_SOCK_ADDR, reinterpret_cast<const sockaddr*>(&storage),
      MHD_OPTION_CONNECTION_LIMIT, static_cast<unsigned>(o.connection_limit),
      MHD_OPTION_PER_IP_CONNECTION_LIMIT, static_cast<unsigned>(o.per_ip_connection_limit),
      MHD_OPTION_CONNECTION_TIMEOUT, static_cast<unsigned>(o.connection_timeout_s),
      MHD_OPTION_CONNECTION_MEMORY_LIMIT, static_cast<size_t>(o.connection_memory_limit_bytes),
      MHD_OPTION_LISTEN_BACKLOG_SIZE, static_cast<unsigned>(o.connection_limit),
      MHD_OPTION_ARRAY, pool_option,
      MHD_OPTION_END);
  // clang-format on
  state.starting.store(false);
  if (impl->daemon == nullptr) {
    const std::string bind_reason = ProbeBind(address);
    if (!bind_reason.empty()) {
      return absl::UnavailableError(
          absl::StrCat("http endpoint: cannot bind ", o.bind, ": ", bind_reason));
    }
    std::lock_guard<std::mutex> lock(state.start_log_mu);
    return absl::UnavailableError(
        absl::StrCat("http endpoint: libmicrohttpd could not start on ", o.bind, ": ",
                     state.start_log.empty() ? "no reason given" : state.start_log));
  }
  const MHD_DaemonInfo* info = MHD_get_daemon_info(impl->daemon, MHD_DAEMON_INFO_BIND_PORT);
  impl->port = info != nullptr ? info->port : address.port;
  impl->bind_address = HostPort(address, impl->port);
  spdlog::info("http endpoint: serving /metrics, /healthz and /readyz on http://{}",
               impl->bind_address);
  return std::unique_ptr<HttpEndpoint>(new HttpEndpoint(std::move(impl)));
}

}  // namespace huddle::service
