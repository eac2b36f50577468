// A real Prometheus server (Debian's `prometheus`, started here on loopback) scrapes `huddle
// serve` while a job runs, and `promtool check metrics` passes on the exposition it scraped.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <thread>

#include "cli/commands.h"
#include "tests/integration/process.h"

namespace huddle::testing {
namespace {

using std::chrono::seconds;

constexpr char kFashionMnist[] = "/usr/share/datasets/fashion-mnist";

// The body of GET http://127.0.0.1:PORT/PATH ("" on any failure). HTTP/1.0: the server closes
// the connection after its answer.
std::string Get(int port, const std::string& path) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return {};
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  timeval tv{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  std::string response;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    const std::string request = "GET " + path + " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
    if (::send(fd, request.data(), request.size(), 0) == static_cast<ssize_t>(request.size())) {
      char buf[8192];
      ssize_t n;
      while ((n = ::recv(fd, buf, sizeof(buf), 0)) > 0)
        response.append(buf, static_cast<size_t>(n));
    }
  }
  ::close(fd);
  const size_t body = response.find("\r\n\r\n");
  return body == std::string::npos ? std::string() : response.substr(body + 4);
}

bool Installed(const char* path) { return std::filesystem::exists(path); }

TEST(PrometheusScrape, APrometheusServerScrapesTheServiceAndPromtoolPassesItsExposition) {
  if (!Installed("/usr/bin/prometheus") || !Installed("/usr/bin/promtool")) {
    GTEST_SKIP() << "Prometheus is not installed (Debian package prometheus; scripts/setup.sh)";
  }
  if (!std::filesystem::exists(std::string(kFashionMnist) + "/train-images-idx3-ubyte.gz")) {
    GTEST_SKIP() << "Fashion-MNIST is not installed (Debian package dataset-fashion-mnist)";
  }
  const std::string dir = MakeTempDir("prometheus_scrape");
  const int agents_port = FreeLoopbackPort();
  const int operators_port = FreeLoopbackPort();
  const int http_port = FreeLoopbackPort();
  const int prometheus_port = FreeLoopbackPort();
  WriteText(dir + "/server.yaml",
            "service: {bind: \"tcp://127.0.0.1:" + std::to_string(agents_port) +
                "\", operator_bind: \"tcp://127.0.0.1:" + std::to_string(operators_port) +
                "\", state_dir: \"" + dir +
                "/state\", heartbeat_interval_s: 0.2}\n"
                "http: {bind: \"127.0.0.1:" +
                std::to_string(http_port) + "\"}\n");
  Process service({HuddleBin(), "serve", "--config", dir + "/server.yaml", "--insecure"},
                  dir + "/serve.log");
  std::vector<std::unique_ptr<Process>> agents;
  for (int i = 0; i < 2; ++i) {
    const std::string yaml = dir + "/agent-" + std::to_string(i) + ".yaml";
    WriteText(yaml, "coordinator: tcp://127.0.0.1:" + std::to_string(agents_port) +
                        "\nclient_id: site-" + std::to_string(i) +
                        "\ndatasets:\n  fmnist: {path: " + kFashionMnist +
                        ", partition: iid, num_shards: 2, shard: " + std::to_string(i) + "}\n");
    agents.push_back(std::make_unique<Process>(
        std::vector<std::string>{HuddleBin(), "agent", "--config", yaml, "--insecure"},
        dir + "/agent-" + std::to_string(i) + ".log"));
  }
  WriteText(dir + "/job.yaml",
            "name: scraped\nseed: 1\nrounds: 30\nmodel: {kind: mlp, hidden: [16]}\n"
            "train: {epochs: 1, batch_size: 64, learning_rate: 0.05}\n"
            "cohort: {sampling: fixed, size: 2}\nround: {deadline_s: 60, quorum: 2}\n"
            "evaluation: {every: 1}\ncoordinator: {min_clients: 2}\ndata: {name: fmnist}\n");
  const Finished submit =
      RunToEnd({HuddleBin(), "submit", dir + "/job.yaml", "--service",
                "tcp://127.0.0.1:" + std::to_string(operators_port), "--insecure"},
               dir + "/submit.log", seconds(30));
  ASSERT_EQ(submit.exit_code, 0) << submit.log;
  WriteText(dir + "/prometheus.yml",
            "global: {scrape_interval: 1s, scrape_timeout: 1s}\n"
            "scrape_configs:\n"
            "  - job_name: huddle\n"
            "    static_configs: [{targets: ['127.0.0.1:" +
                std::to_string(http_port) + "']}]\n");
  Process prometheus({"/usr/bin/prometheus", "--config.file=" + dir + "/prometheus.yml",
                      "--storage.tsdb.path=" + dir + "/tsdb",
                      "--web.listen-address=127.0.0.1:" + std::to_string(prometheus_port)},
                     dir + "/prometheus.log");
  // Prometheus has scraped the service's rounds: the job's round and the target's health.
  nlohmann::json round;
  std::string last;
  ASSERT_TRUE(WaitFor(
      [&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(500));
        last = Get(prometheus_port,
                   "/api/v1/query?query=huddle_job_round%7Bhuddle_job%3D%22scraped%22%7D");
        const auto r = nlohmann::json::parse(last, nullptr, false);
        if (r.is_discarded() || r.value("status", "") != "success") return false;
        const auto& result = r["data"]["result"];
        if (result.empty()) return false;
        round = result[0];
        return std::stod(round["value"][1].get<std::string>()) >= 2;
      },
      seconds(120)))
      << "last answer: " << last << "\n"
      << ReadAll(dir + "/prometheus.log");
  const auto up =
      nlohmann::json::parse(Get(prometheus_port, "/api/v1/query?query=up"), nullptr, false);
  ASSERT_FALSE(up.is_discarded());
  EXPECT_EQ(up["data"]["result"][0]["value"][1], "1") << up.dump();
  // The exposition itself passes promtool's check (its lint included).
  const std::string exposition = Get(http_port, "/metrics");
  ASSERT_NE(exposition.find("huddle_job_test_accuracy{huddle_job=\"scraped\"}"), std::string::npos)
      << exposition;
  ASSERT_NE(exposition.find("huddle_operator_round_duration_seconds_bucket"), std::string::npos);
  WriteText(dir + "/exposition.txt", exposition);
  const Finished check =
      RunToEnd({"/bin/sh", "-c", "/usr/bin/promtool check metrics < " + dir + "/exposition.txt"},
               dir + "/promtool.log", seconds(60));
  EXPECT_EQ(check.exit_code, 0) << check.log << exposition;
  EXPECT_EQ(Get(http_port, "/readyz").substr(0, 5), "ready");
}

}  // namespace
}  // namespace huddle::testing
