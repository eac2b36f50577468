// The HTTP endpoint over real sockets on 127.0.0.1 (port 0), with a tiny blocking HTTP/1.1 client:
// the three paths, the refusals (404, 405, 413), bind errors, and a hostile client holding more
// idle connections than the limits allow.
#include "service/http_endpoint.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <thread>

#include "service/prometheus.h"

namespace huddle::service {
namespace {

using std::chrono::steady_clock;

struct Response {
  int status = 0;
  std::map<std::string, std::string> headers;  // names lower-cased
  std::string body;
};

// A TCP connection to 127.0.0.1:port with send/receive deadlines of `timeout_ms`; -1 on failure.
int Connect(uint16_t port, int timeout_ms = 3000) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  timeval tv{timeout_ms / 1000, (timeout_ms % 1000) * 1000};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(port);
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

bool SendAll(int fd, std::string_view data) {
  while (!data.empty()) {
    const ssize_t n = send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (n <= 0) return false;
    data.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

// Sends `request` (a whole HTTP/1.1 request) and reads the answer until the server closes.
StatusOr<Response> Exchange(uint16_t port, const std::string& request) {
  const int fd = Connect(port);
  if (fd < 0) return absl::UnavailableError("connect failed");
  std::string raw;
  const bool sent = SendAll(fd, request);
  char buffer[4096];
  ssize_t n;
  while ((n = recv(fd, buffer, sizeof(buffer), 0)) > 0) raw.append(buffer, static_cast<size_t>(n));
  close(fd);
  const size_t head_end = raw.find("\r\n\r\n");
  if (head_end == std::string::npos || raw.compare(0, 9, "HTTP/1.1 ") != 0) {
    return absl::UnavailableError(
        absl::StrCat("no HTTP answer (sent: ", sent, ", got ", raw.size(), " bytes)"));
  }
  Response response;
  response.status = std::stoi(raw.substr(9, 3));
  std::istringstream head(raw.substr(0, head_end));
  std::string line;
  std::getline(head, line);  // the status line
  while (std::getline(head, line)) {
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string name = line.substr(0, colon);
    for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    std::string value = line.substr(colon + 1);
    value.erase(0, value.find_first_not_of(' '));
    if (!value.empty() && value.back() == '\r') value.pop_back();
    response.headers[name] = value;
  }
  response.body = raw.substr(head_end + 4);
  return response;
}

StatusOr<Response> Request(uint16_t port, const std::string& method, const std::string& path,
                           const std::string& extra_headers = "") {
  return Exchange(port, method + " " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\n" + extra_headers +
                            "Connection: close\r\n\r\n");
}

// The value of a "Name:   value" line of /proc/self/status (Threads, VmRSS in kB).
long ProcStatus(const std::string& name) {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind(name + ":", 0) == 0) return std::stol(line.substr(name.size() + 1));
  }
  return -1;
}

class HttpEndpointTest : public ::testing::Test {
 protected:
  void StartEndpoint(HttpEndpointOptions options = {}) {
    options.bind = "127.0.0.1:0";
    HttpHandlers handlers;
    handlers.metrics = [this]() -> StatusOr<std::string> {
      ++scrapes_;
      if (metrics_fail_) return absl::InternalError("snapshot\nfailed");
      return Render({MetricFamily::Counter("huddle_rounds_total", "Rounds.").Add(7)});
    };
    handlers.ready = [this](std::string* reason) {
      if (ready_) return true;
      *reason = "waiting for quorum:\n3 of 5 clients";
      return false;
    };
    StatusOr<std::unique_ptr<HttpEndpoint>> endpoint = HttpEndpoint::Start(options, handlers);
    ASSERT_TRUE(endpoint.ok()) << endpoint.status();
    endpoint_ = *std::move(endpoint);
    ASSERT_NE(endpoint_->port(), 0);
    EXPECT_EQ(endpoint_->bind_address(), "127.0.0.1:" + std::to_string(endpoint_->port()));
  }
  uint16_t port() const { return endpoint_->port(); }

  std::atomic<int> scrapes_{0};
  std::atomic<bool> metrics_fail_{false};
  std::atomic<bool> ready_{true};
  std::unique_ptr<HttpEndpoint> endpoint_;
};

TEST_F(HttpEndpointTest, MetricsAnswersTheExposition) {
  StartEndpoint();
  StatusOr<Response> r = Request(port(), "GET", "/metrics");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->headers["content-type"], "text/plain; version=0.0.4; charset=utf-8");
  EXPECT_EQ(r->body,
            "# HELP huddle_rounds_total Rounds.\n# TYPE huddle_rounds_total counter\n"
            "huddle_rounds_total 7\n");
  EXPECT_EQ(scrapes_.load(), 1);
  r = Request(port(), "GET", "/metrics?name[]=x");  // a query string is ignored
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status, 200);
}

TEST_F(HttpEndpointTest, HeadAnswersHeadersWithoutBody) {
  StartEndpoint();
  StatusOr<Response> r = Request(port(), "HEAD", "/metrics");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->body, "");
  EXPECT_EQ(r->headers["content-type"], kPrometheusContentType);
}

TEST_F(HttpEndpointTest, KeepsTheConnectionAliveBetweenScrapes) {
  StartEndpoint();
  const int fd = Connect(port());
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(SendAll(fd, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"));
  char buffer[4096];
  std::string first;  // until the whole first answer is in: the connection stays open
  while (first.find("huddle_rounds_total 7\n") == std::string::npos) {
    const ssize_t n = recv(fd, buffer, sizeof(buffer), 0);
    ASSERT_GT(n, 0) << "closed after " << first;
    first.append(buffer, static_cast<size_t>(n));
  }
  EXPECT_EQ(first.rfind("HTTP/1.1 200", 0), 0u) << first;
  EXPECT_EQ(first.find("Connection: close"), std::string::npos) << first;
  ASSERT_TRUE(SendAll(fd, "GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"));
  std::string second;
  ssize_t m;
  while ((m = recv(fd, buffer, sizeof(buffer), 0)) > 0)
    second.append(buffer, static_cast<size_t>(m));
  close(fd);
  EXPECT_EQ(second.rfind("HTTP/1.1 200", 0), 0u) << second;
  EXPECT_EQ(second.substr(second.size() - 3), "ok\n");
  EXPECT_EQ(scrapes_.load(), 1);
}

TEST_F(HttpEndpointTest, MetricsErrorIs500WithOneLine) {
  StartEndpoint();
  metrics_fail_ = true;
  StatusOr<Response> r = Request(port(), "GET", "/metrics");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status, 500);
  EXPECT_EQ(r->body, "snapshot failed\n");
}

TEST_F(HttpEndpointTest, HealthzAndReadyz) {
  StartEndpoint();
  StatusOr<Response> r = Request(port(), "GET", "/healthz");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->body, "ok\n");
  r = Request(port(), "GET", "/readyz");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->body, "ready\n");
  ready_ = false;
  r = Request(port(), "GET", "/readyz");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status, 503);
  EXPECT_EQ(r->body, "waiting for quorum: 3 of 5 clients\n");
  EXPECT_EQ(r->headers["content-type"], "text/plain; charset=utf-8");
}

TEST_F(HttpEndpointTest, RefusesUnknownPathsOtherMethodsAndBodies) {
  StartEndpoint();
  StatusOr<Response> r = Request(port(), "GET", "/");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status, 404);
  r = Request(port(), "GET", "/metrics/extra");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status, 404);
  r = Exchange(port(),
               "POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n"
               "Connection: close\r\n\r\nhello");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status, 405);
  EXPECT_EQ(r->headers["allow"], "GET, HEAD");
  r = Request(port(), "DELETE", "/healthz");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status, 405);
  r = Exchange(port(),
               "GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n"
               "Connection: close\r\n\r\nhello");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status, 413);
  r = Exchange(port(),
               "GET /metrics HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
               "Connection: close\r\n\r\n5\r\nhello\r\n0\r\n\r\n");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status, 413);
  EXPECT_EQ(scrapes_.load(), 0);  // none of these reached the metrics handler
}

TEST_F(HttpEndpointTest, OversizedHeadersAreRefusedAndServingGoesOn) {
  StartEndpoint();
  StatusOr<Response> r =
      Request(port(), "GET", "/metrics", "X-Big: " + std::string(64 * 1024, 'a') + "\r\n");
  if (r.ok()) {  // or the connection is simply closed
    EXPECT_GE(r->status, 400);
  }
  r = Request(port(), "GET", "/healthz");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status, 200);
}

TEST_F(HttpEndpointTest, TwoThreads) {
  HttpEndpointOptions options;
  options.threads = 2;
  StartEndpoint(options);
  for (int i = 0; i < 4; ++i) {
    StatusOr<Response> r = Request(port(), "GET", "/metrics");
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->status, 200);
  }
}

// Waits until the server has closed `fd` (end of stream, maybe after an error answer) or
// `deadline` passes; whether it did.
bool ClosedByServer(int fd, steady_clock::time_point deadline) {
  char buffer[512];
  while (true) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - steady_clock::now());
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(std::max<int64_t>(left.count(), 0))) != 1) return false;
    const ssize_t n = recv(fd, buffer, sizeof(buffer), MSG_DONTWAIT);
    if (n <= 0) return true;  // end of stream or reset
  }
}

// A client opens far more connections than the limits and holds them idle, some after half a
// request line. The endpoint closes the excess at once, keeps its thread count and memory, and
// answers a fresh scrape once the idle ones have timed out.
TEST_F(HttpEndpointTest, HostileClientCannotExhaustTheEndpoint) {
  HttpEndpointOptions options;
  options.connection_limit = 8;
  options.per_ip_connection_limit = 4;
  options.connection_timeout_s = 2;
  StartEndpoint(options);
  const long threads_before = ProcStatus("Threads");
  const long rss_before_kb = ProcStatus("VmRSS");
  ASSERT_GT(threads_before, 0);

  // Paced a little, so that the listen backlog (connection_limit deep) rarely overflows: a connect
  // into a full backlog waits a second for the SYN's retransmission.
  const auto start = steady_clock::now();
  std::vector<int> held;
  for (int i = 0; i < 64; ++i) {
    const int fd = Connect(port(), 500);
    if (fd < 0) continue;  // the backlog was full: refused, as well
    if (i % 2 == 1) SendAll(fd, "GET /metr");
    held.push_back(fd);
    std::this_thread::sleep_for(std::chrono::milliseconds(3));
  }
  ASSERT_GE(held.size(), 16u);
  // Every slot this address may hold is taken (the first few connections, idle for less than the
  // timeout): a scrape now is closed unanswered.
  StatusOr<Response> refused = Request(port(), "GET", "/metrics");
  if (steady_clock::now() - start < std::chrono::seconds(1)) {
    EXPECT_FALSE(refused.ok()) << "answered " << refused->status << " past the per-IP limit";
    // All but per_ip_connection_limit of the held connections were closed at once.
    const auto soon = steady_clock::now() + std::chrono::milliseconds(300);
    size_t still_open = 0;
    for (int fd : held) still_open += ClosedByServer(fd, soon) ? 0 : 1;
    EXPECT_LE(still_open, options.per_ip_connection_limit);
  }
  EXPECT_EQ(ProcStatus("Threads"), threads_before);

  // Once the idle connections time out the endpoint answers again.
  StatusOr<Response> r = absl::UnavailableError("not tried");
  const auto deadline = start + std::chrono::seconds(options.connection_timeout_s + 5);
  while (steady_clock::now() < deadline) {
    r = Request(port(), "GET", "/metrics");
    if (r.ok()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_TRUE(r.ok()) << "no answer within the timeout: " << r.status();
  EXPECT_EQ(r->status, 200);
  EXPECT_GE(steady_clock::now() - start, std::chrono::seconds(1));  // held off by the idle ones
  // The server closed every held connection.
  for (int fd : held) {
    EXPECT_TRUE(ClosedByServer(fd, deadline));
    close(fd);
  }
  EXPECT_EQ(ProcStatus("Threads"), threads_before);
  EXPECT_LT(ProcStatus("VmRSS") - rss_before_kb, 16 * 1024) << "kB of RSS grown";
}

TEST(HttpEndpointStartTest, PortInUseNamesTheAddress) {
  StatusOr<std::unique_ptr<HttpEndpoint>> first = HttpEndpoint::Start({.bind = "127.0.0.1:0"}, {});
  ASSERT_TRUE(first.ok()) << first.status();
  const std::string bind = "127.0.0.1:" + std::to_string((*first)->port());
  StatusOr<std::unique_ptr<HttpEndpoint>> second = HttpEndpoint::Start({.bind = bind}, {});
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(std::string(second.status().message()).find("cannot bind " + bind), std::string::npos)
      << second.status();
  EXPECT_NE(std::string(second.status().message()).find("in use"), std::string::npos)
      << second.status();
}

TEST(HttpEndpointStartTest, RefusesBadOptions) {
  for (const char* bind : {"127.0.0.1", "example.com:80", "127.0.0.1:65536", "127.0.0.1:-1", ":80",
                           "[::1]", "::1:80", "1.2.3:80", "127.0.0.1:8o"}) {
    StatusOr<std::unique_ptr<HttpEndpoint>> e = HttpEndpoint::Start({.bind = bind}, {});
    ASSERT_FALSE(e.ok()) << bind;
    EXPECT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument) << bind;
    EXPECT_NE(std::string(e.status().message()).find(bind), std::string::npos) << e.status();
  }
  EXPECT_FALSE(HttpEndpoint::Start({.bind = "127.0.0.1:0", .threads = 3}, {}).ok());
  EXPECT_FALSE(HttpEndpoint::Start({.bind = "127.0.0.1:0", .connection_limit = 0}, {}).ok());
  EXPECT_FALSE(
      HttpEndpoint::Start({.bind = "127.0.0.1:0", .connection_memory_limit_bytes = 100}, {}).ok());
}

TEST(HttpEndpointStartTest, ParsesBindAddresses) {
  StatusOr<BindAddress> a = ParseBindAddress("localhost:9464");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->host, "127.0.0.1");
  EXPECT_EQ(a->port, 9464);
  EXPECT_FALSE(a->ipv6);
  a = ParseBindAddress("[::1]:0");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_TRUE(a->ipv6);
  EXPECT_EQ(a->host, "::1");
}

TEST(HttpEndpointStartTest, ServesOnIpv6Loopback) {
  StatusOr<std::unique_ptr<HttpEndpoint>> e = HttpEndpoint::Start({.bind = "[::1]:0"}, {});
  if (!e.ok()) GTEST_SKIP() << "no IPv6 loopback here: " << e.status();
  EXPECT_EQ((*e)->bind_address(), "[::1]:" + std::to_string((*e)->port()));
  const int fd = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in6 address{};
  address.sin6_family = AF_INET6;
  address.sin6_port = htons((*e)->port());
  address.sin6_addr = in6addr_loopback;
  ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  ASSERT_TRUE(SendAll(fd, "GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"));
  char buffer[256] = {};
  ASSERT_GT(recv(fd, buffer, sizeof(buffer) - 1, 0), 0);
  close(fd);
  EXPECT_EQ(std::string(buffer).rfind("HTTP/1.1 200", 0), 0u) << buffer;
}

}  // namespace
}  // namespace huddle::service
