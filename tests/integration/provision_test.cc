// `huddle provision` end to end (issue 35, "Site kits"): a server, three sites and an operator
// provisioned into a test root ($TMP/etc/huddle, $TMP/var/lib/huddle), each tarball unpacked by
// the system's tar as its README says, `huddle serve` and three `huddle agent` started from the
// kits' configs alone, a one-round job submitted with the operator kit's key and done; then
// `--rotate site-a`: the server's new allow-list installed and reloaded, the old site-a key
// refused at its next handshake, and the new site-a kit joining the next job. And a project with
// secure aggregation, whose job's rounds are secure sums of the three kits' sites.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <thread>

#include "tests/integration/job_yaml.h"
#include "tests/integration/process.h"

namespace huddle::testing {
namespace {

using std::chrono::seconds;
namespace fs = std::filesystem;

constexpr char kFashionMnist[] = "/usr/share/datasets/fashion-mnist";

class ProvisionIntegrationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(std::string(kFashionMnist) + "/train-images-idx3-ubyte.gz")) {
      GTEST_SKIP() << "Fashion-MNIST is not installed (Debian package dataset-fashion-mnist)";
    }
    dir_ = MakeTempDir("provision_it");
    etc_ = dir_ + "/etc/huddle";
    state_ = dir_ + "/var/lib/huddle";
    operators_port_ = FreeLoopbackPort();
  }
  void TearDown() override {
    if (!HasFailure() && !dir_.empty()) fs::remove_all(dir_);
  }

  // A server on loopback ports, sites a-c holding Fashion-MNIST's iid thirds, operator alice.
  void WriteProject(const std::string& extra = "") {
    std::string sites;
    for (const char site : {'a', 'b', 'c'}) {
      sites += std::string("  site-") + site + ": {datasets: {fmnist: {path: " + kFashionMnist +
               ", partition: iid, num_shards: 3, shard: " + std::to_string(site - 'a') + "}}}\n";
    }
    WriteText(dir_ + "/project.yaml",
              "project: provision-it\nserver:\n  address: 127.0.0.1\n  bind_host: 127.0.0.1\n"
              "  port: " +
                  std::to_string(FreeLoopbackPort()) +
                  "\n  operator_bind: tcp://127.0.0.1:" + std::to_string(operators_port_) +
                  "\n  http_bind: 127.0.0.1:" + std::to_string(FreeLoopbackPort()) + "\nsites:\n" +
                  sites + "operators: [alice]\n" + extra);
  }

  Finished Huddle(std::vector<std::string> args) {
    args.insert(args.begin(), HuddleBin());
    return RunToEnd(args, dir_ + "/cmd-" + std::to_string(commands_++) + ".log", seconds(60));
  }
  Finished Provision(const std::vector<std::string>& extra = {}) {
    std::vector<std::string> args = {
        "provision", dir_ + "/project.yaml", "--out", dir_ + "/kits", "--etc-dir",
        etc_,        "--state-dir",          state_};
    args.insert(args.end(), extra.begin(), extra.end());
    return Huddle(args);
  }
  // KIT.tar.gz unpacked into the etc directory with the system's tar (`options`: more of tar's
  // arguments, e.g. the members to unpack).
  void Install(const std::string& kit, const std::vector<std::string>& options = {}) {
    fs::create_directories(etc_);
    std::vector<std::string> argv = {"/usr/bin/tar", "-xzf", dir_ + "/kits/" + kit + ".tar.gz",
                                     "-C",           etc_,   "--no-same-owner"};
    argv.insert(argv.end(), options.begin(), options.end());
    const Finished f = RunToEnd(argv, dir_ + "/tar.log", seconds(30));
    ASSERT_EQ(f.exit_code, 0) << f.log;
  }
  std::unique_ptr<Process> Agent(const std::string& site, const std::string& log) {
    return std::make_unique<Process>(
        std::vector<std::string>{HuddleBin(), "agent", "--config",
                                 etc_ + "/agents/" + site + "/agent.yaml"},
        dir_ + "/" + log);
  }
  // An operator command with the operator kit's key.
  Finished Operator(std::vector<std::string> args) {
    const std::string kit = etc_ + "/operators/alice";
    args.insert(args.end(), {"--service", "tcp://127.0.0.1:" + std::to_string(operators_port_),
                             "--server-key", kit + "/server.pub", "--key", kit + "/alice.key"});
    return Huddle(args);
  }
  std::string JobFile(const std::string& name, const std::string& extra = "") {
    const std::string path = dir_ + "/" + name + ".yaml";
    WriteText(path, ServiceJobYaml(name, /*rounds=*/1, /*seed=*/3).Text() + extra);
    return path;
  }
  std::string State(const std::string& job) {
    const Finished f = Operator({"status", job, "--json"});
    if (f.log.find('{') == std::string::npos) return "?";
    auto j = nlohmann::json::parse(f.log.substr(f.log.find('{')), nullptr, false);
    return j.is_discarded() ? "?" : j["job"].value("state", "?");
  }
  bool WaitForState(const std::string& job, const std::string& state, seconds timeout) {
    return WaitFor(
        [&] {
          std::this_thread::sleep_for(std::chrono::milliseconds(450));  // rate-limited requests
          return State(job) == state;
        },
        timeout);
  }

  std::string dir_, etc_, state_;
  int operators_port_ = 0;
  int commands_ = 0;
};

TEST_F(ProvisionIntegrationTest, KitsInstallWithTarRunAJobAndARotatedSiteRejoins) {
  const auto start = std::chrono::steady_clock::now();
  WriteProject();
  const Finished provisioned = Provision();
  ASSERT_EQ(provisioned.exit_code, 0) << provisioned.log;
  for (const std::string kit : {"server", "site-a", "site-b", "site-c", "operator-alice"}) {
    Install(kit);
  }
  for (const std::string key :
       {"/keys/server.key", "/agents/site-a/site-a.key", "/operators/alice/alice.key"}) {
    EXPECT_EQ(fs::status(etc_ + key).permissions() & fs::perms::all,
              fs::perms::owner_read | fs::perms::owner_write)
        << key;
  }

  Process service({HuddleBin(), "serve", "--config", etc_ + "/server.yaml"}, dir_ + "/serve.log");
  std::vector<std::unique_ptr<Process>> agents;
  for (const std::string site : {"site-a", "site-b", "site-c"}) {
    agents.push_back(Agent(site, site + ".log"));
  }
  Finished submitted;
  ASSERT_TRUE(WaitFor(
      [&] {
        return (submitted = Operator({"submit", JobFile("first")})).exit_code == 0;
      },
      seconds(20)))
      << submitted.log << ReadAll(dir_ + "/serve.log");
  ASSERT_TRUE(WaitForState("first", "completed", seconds(60))) << ReadAll(dir_ + "/serve.log");
  EXPECT_EQ(ReadLines(state_ + "/service/jobs/first/out/metrics.jsonl").size(), 1u);

  // A new key pair for site-a: the server's new allow-list installed as its README says and
  // read again (SIGHUP); site-a's old key is refused at its next handshake.
  const std::string old_pub = ReadAll(etc_ + "/keys/allowed/site-a.pub");
  const Finished rotated = Provision({"--rotate", "site-a"});
  ASSERT_EQ(rotated.exit_code, 0) << rotated.log;
  EXPECT_NE(rotated.log.find("rotated (was "), std::string::npos) << rotated.log;
  Install("server", {"--recursive-unlink", "keys/allowed", "keys/operators"});
  EXPECT_NE(ReadAll(etc_ + "/keys/allowed/site-a.pub"), old_pub);
  const auto reloads = [&] {
    const std::string log = ReadAll(dir_ + "/serve.log");
    size_t n = 0;
    for (size_t at = log.find("clients' allow-list reloaded"); at != std::string::npos;
         at = log.find("clients' allow-list reloaded", at + 1)) {
      ++n;
    }
    return n;
  };
  const size_t before = reloads();
  service.Kill(SIGHUP);
  ASSERT_TRUE(WaitFor([&] { return reloads() > before; }, seconds(10)));
  agents[0]->Kill(SIGTERM);
  EXPECT_EQ(agents[0]->Wait(seconds(20)), 128 + SIGTERM);
  agents[0] = Agent("site-a", "site-a-old-key.log");  // the old kit's key, still in place
  EXPECT_TRUE(WaitFor(
      [&] {
        return ReadAll(dir_ + "/site-a-old-key.log").find("refused this client's key") !=
               std::string::npos;
      },
      seconds(20)))
      << ReadAll(dir_ + "/site-a-old-key.log");
  EXPECT_NE(ReadAll(dir_ + "/serve.log").find("is not enrolled"), std::string::npos);
  agents[0]->Kill(SIGTERM);
  agents[0]->Wait(seconds(20));

  // The new site-a kit joins the next job.
  Install("site-a");
  agents[0] = Agent("site-a", "site-a-rotated.log");
  ASSERT_EQ(Operator({"submit", JobFile("second")}).exit_code, 0);
  ASSERT_TRUE(WaitForState("second", "completed", seconds(60)))
      << ReadAll(dir_ + "/serve.log") << ReadAll(dir_ + "/site-a-rotated.log");
  EXPECT_NE(ReadAll(dir_ + "/site-a-rotated.log").find("job 'second': done"), std::string::npos)
      << ReadAll(dir_ + "/site-a-rotated.log");
  service.Kill(SIGTERM);
  EXPECT_EQ(service.Wait(seconds(30)), 128 + SIGTERM);
  const double elapsed_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("provision -> two jobs and a rotation: %.1f s\n", elapsed_s);
}

// With secure aggregation: the project key certified every site, the server's allow-list carries
// the certificates and each site pins project.pub, so a job's rounds are secure sums.
TEST_F(ProvisionIntegrationTest, ASecureAggregationProjectTrainsSecureSums) {
  WriteProject("secure_aggregation: true\n");
  const Finished provisioned = Provision();
  ASSERT_EQ(provisioned.exit_code, 0) << provisioned.log;
  for (const std::string kit : {"server", "site-a", "site-b", "site-c", "operator-alice"}) {
    Install(kit);
  }
  EXPECT_FALSE(fs::exists(etc_ + "/project")) << "the project key is not installed on the server";
  Process service({HuddleBin(), "serve", "--config", etc_ + "/server.yaml"}, dir_ + "/serve.log");
  std::vector<std::unique_ptr<Process>> agents;
  for (const std::string site : {"site-a", "site-b", "site-c"}) {
    agents.push_back(Agent(site, site + ".log"));
  }
  Finished submitted;
  ASSERT_TRUE(WaitFor(
      [&] {
        return (submitted = Operator({"submit", JobFile("secure",
                                                        "aggregation: {max_update_norm: 5}\n"
                                                        "secure_aggregation: {enabled: true}\n")}))
                   .exit_code == 0;
      },
      seconds(20)))
      << submitted.log;
  ASSERT_TRUE(WaitForState("secure", "completed", seconds(60))) << ReadAll(dir_ + "/serve.log");
  EXPECT_NE(ReadAll(dir_ + "/serve.log").find("secure sum of 3"), std::string::npos)
      << ReadAll(dir_ + "/serve.log");
  service.Kill(SIGTERM);
  EXPECT_EQ(service.Wait(seconds(30)), 128 + SIGTERM);
}

}  // namespace
}  // namespace huddle::testing
