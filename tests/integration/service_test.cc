// `huddle serve`, `huddle agent` and the operator commands as real processes on 127.0.0.1: jobs
// back to back on the same agents, a service restart mid-job that resumes (bitwise equal to an
// uninterrupted run), an operator command refused for a client key (passed as is, relabelled as an
// operator's, its .pub copied into the operators' directory), hostile submissions, stop.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <thread>

#include "cli/commands.h"
#include "tests/integration/job_yaml.h"
#include "tests/integration/process.h"

namespace huddle::testing {
namespace {

using std::chrono::seconds;

constexpr char kFashionMnist[] = "/usr/share/datasets/fashion-mnist";

class ServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(std::string(kFashionMnist) + "/train-images-idx3-ubyte.gz")) {
      GTEST_SKIP() << "Fashion-MNIST is not installed (Debian package dataset-fashion-mnist)";
    }
    dir_ = MakeTempDir("service");
    // Keys: the service's, three agents' (enrolled), an operator's (its own role, in its own list).
    ASSERT_TRUE(cli::GenerateLocalKeys(dir_ + "/keys", {"site-0", "site-1", "site-2"}).ok());
    RunOk({HuddleBin(), "keygen", "operator", "--id", "alice", "--out", dir_ + "/operators"});
    std::filesystem::create_directories(dir_ + "/operators-allowed");
    std::filesystem::copy_file(dir_ + "/operators/alice.pub",
                               dir_ + "/operators-allowed/alice.pub");
    agents_port_ = FreeLoopbackPort();
    operators_port_ = FreeLoopbackPort();
    WriteText(dir_ + "/server.yaml",
              "service:\n"
              "  bind: tcp://127.0.0.1:" +
                  std::to_string(agents_port_) +
                  "\n"
                  "  operator_bind: tcp://127.0.0.1:" +
                  std::to_string(operators_port_) +
                  "\n"
                  "  state_dir: " +
                  dir_ +
                  "/state\n"
                  "  heartbeat_interval_s: 0.2\n"
                  "http: {bind: \"127.0.0.1:" +
                  std::to_string(FreeLoopbackPort()) +
                  "\"}\n"
                  "security:\n"
                  "  server_secret_key: " +
                  dir_ +
                  "/keys/server.key\n"
                  "  allowed_clients: " +
                  dir_ +
                  "/keys/allowed\n"
                  "  operators: " +
                  dir_ + "/operators-allowed\n");
    for (int i = 0; i < 3; ++i) {
      const std::string id = "site-" + std::to_string(i);
      WriteText(dir_ + "/" + id + ".yaml",
                "coordinator: tcp://127.0.0.1:" + std::to_string(agents_port_) +
                    "\n"
                    "connection: {coordinator_timeout_s: 3, backoff_max_s: 0.5}\n"
                    "security:\n"
                    "  server_public_key: " +
                    dir_ +
                    "/keys/server.pub\n"
                    "  secret_key: " +
                    dir_ + "/keys/clients/" + id +
                    ".key\n"
                    "datasets:\n"
                    "  fmnist: {path: " +
                    kFashionMnist + ", partition: iid, num_shards: 3, shard: " + std::to_string(i) +
                    "}\n");
    }
  }

  void RunOk(const std::vector<std::string>& argv) {
    const Finished f = RunToEnd(argv, dir_ + "/cmd.log", seconds(30));
    ASSERT_EQ(f.exit_code, 0) << f.log;
  }
  std::unique_ptr<Process> StartService() {
    return std::make_unique<Process>(
        std::vector<std::string>{HuddleBin(), "serve", "--config", dir_ + "/server.yaml"},
        dir_ + "/serve.log");
  }
  std::unique_ptr<Process> StartAgent(int i) {
    return std::make_unique<Process>(
        std::vector<std::string>{HuddleBin(), "agent", "--config",
                                 dir_ + "/site-" + std::to_string(i) + ".yaml"},
        dir_ + "/agent-" + std::to_string(i) + ".log");
  }
  // An operator command as `key` (default: alice's); its exit code and output.
  Finished Operator(std::vector<std::string> args, const std::string& key = "") {
    std::vector<std::string> argv = {HuddleBin()};
    argv.insert(argv.end(), args.begin(), args.end());
    argv.insert(argv.end(), {"--service", "tcp://127.0.0.1:" + std::to_string(operators_port_),
                             "--server-key", dir_ + "/keys/server.pub", "--key",
                             key.empty() ? dir_ + "/operators/alice.key" : key});
    const std::string log = dir_ + "/op-" + std::to_string(ops_++) + ".log";
    return RunToEnd(argv, log, seconds(30));
  }
  std::string WriteJobFile(const std::string& name, int rounds, const std::string& extra = "") {
    const std::string path = dir_ + "/" + name + ".yaml";
    WriteText(path, ServiceJobYaml(name, rounds, /*seed=*/5).Text() + extra);
    return path;
  }
  std::string State(const std::string& job) {
    const Finished f = Operator({"status", job, "--json"});
    if (f.log.find('{') == std::string::npos) return "?";
    auto j = nlohmann::json::parse(f.log.substr(f.log.find('{')), nullptr, false);
    if (j.is_discarded()) return "?";
    return j["job"].value("state", "?");
  }
  // Polls the job's state twice a second (an operator's requests are rate-limited).
  bool WaitForState(const std::string& job, const std::string& state, seconds timeout) {
    return WaitFor(
        [&] {
          std::this_thread::sleep_for(std::chrono::milliseconds(450));
          return State(job) == state;
        },
        timeout);
  }
  std::string Out(const std::string& job) { return dir_ + "/state/jobs/" + job + "/out"; }

  std::string dir_;
  int agents_port_ = 0;
  int operators_port_ = 0;
  int ops_ = 0;
};

TEST_F(ServiceTest, TwoJobsBackToBackOnTheSameAgents) {
  auto service = StartService();
  std::vector<std::unique_ptr<Process>> agents;
  for (int i = 0; i < 3; ++i) agents.push_back(StartAgent(i));
  ASSERT_EQ(Operator({"submit", WriteJobFile("first", 3)}).exit_code, 0);
  ASSERT_EQ(Operator({"submit", WriteJobFile("second", 3)}).exit_code, 0);
  ASSERT_TRUE(WaitForState("second", "completed", seconds(120))) << ReadAll(dir_ + "/serve.log");
  EXPECT_EQ(State("first"), "completed");
  for (const std::string job : {"first", "second"}) {
    EXPECT_EQ(ReadLines(Out(job) + "/metrics.jsonl").size(), 3u) << job;
    EXPECT_TRUE(std::filesystem::exists(Out(job) + "/model.bin")) << job;
  }
  // The agents stayed: each took part in both jobs and is still connected, idle.
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(agents[i]->running());
    const std::string log = ReadAll(dir_ + "/agent-" + std::to_string(i) + ".log");
    EXPECT_NE(log.find("job 'first': done"), std::string::npos) << log;
    EXPECT_NE(log.find("job 'second': done"), std::string::npos) << log;
  }
  const Finished clients = Operator({"clients", "--json"});
  ASSERT_EQ(clients.exit_code, 0) << clients.log;
  auto j = nlohmann::json::parse(clients.log.substr(clients.log.find('{')));
  ASSERT_EQ(j["clients"].size(), 3u);
  for (const auto& a : j["clients"]) EXPECT_TRUE(a["live"].get<bool>()) << a;
  // Every operator request is in the audit log.
  const auto audit = ReadLines(dir_ + "/state/audit.jsonl");
  ASSERT_GE(audit.size(), 3u);
  auto first = nlohmann::json::parse(audit[0]);
  EXPECT_EQ(first["operator"], "alice");
  EXPECT_EQ(first["command"], "submit");
  EXPECT_EQ(first["job"], "first");
  service->Kill(SIGTERM);
  EXPECT_EQ(service->Wait(seconds(30)), 128 + SIGTERM);
}

TEST_F(ServiceTest, ARestartMidJobResumesItBitwiseEqualToAnUninterruptedRun) {
  auto service = StartService();
  std::vector<std::unique_ptr<Process>> agents;
  for (int i = 0; i < 3; ++i) agents.push_back(StartAgent(i));
  ASSERT_EQ(Operator({"submit", WriteJobFile("whole", 8)}).exit_code, 0);
  ASSERT_TRUE(WaitForState("whole", "completed", seconds(120)));
  ASSERT_EQ(Operator({"submit", WriteJobFile("interrupted", 8)}).exit_code, 0);
  ASSERT_TRUE(WaitFor([&] { return ReadLines(Out("interrupted") + "/metrics.jsonl").size() >= 3; },
                      seconds(120)));
  service->Kill(SIGTERM);
  ASSERT_EQ(service->Wait(seconds(60)), 128 + SIGTERM) << ReadAll(dir_ + "/serve.log");
  const size_t done_before = ReadLines(Out("interrupted") + "/metrics.jsonl").size();
  EXPECT_LT(done_before, 8u);
  service = StartService();  // the agents reconnect by themselves
  ASSERT_TRUE(WaitForState("interrupted", "completed", seconds(120)))
      << ReadAll(dir_ + "/serve.log");
  EXPECT_NE(ReadAll(dir_ + "/serve.log").find("resumes from its checkpoint"), std::string::npos);
  EXPECT_EQ(ReadLines(Out("interrupted") + "/metrics.jsonl").size(), 8u);
  EXPECT_EQ(ReadAll(Out("interrupted") + "/model.bin"), ReadAll(Out("whole") + "/model.bin"))
      << "a seeded, non-DP job resumed after a restart ends with the uninterrupted run's model";
}

TEST_F(ServiceTest, OperatorsAreAuthenticatedAndHostileJobsRefused) {
  auto service = StartService();
  // A client's key is not an operator's: the command refuses it before connecting...
  const Finished as_client = Operator({"jobs"}, dir_ + "/keys/clients/site-0.key");
  EXPECT_EQ(as_client.exit_code, 2) << as_client.log;
  EXPECT_NE(as_client.log.find("is a client key; operator commands take an operator key: `huddle "
                               "keygen operator --id NAME`"),
            std::string::npos)
      << as_client.log;
  // ...and the service refuses it at the handshake, even with its file relabelled (its holder can
  // edit it: the role in a file is only what the file says)...
  std::string relabelled = ReadAll(dir_ + "/keys/clients/site-0.key");
  relabelled.replace(relabelled.find("role: client"), 12, "role: operator");
  const std::string relabelled_key = dir_ + "/site-0-as-operator.key";
  WriteText(relabelled_key, relabelled);
  std::filesystem::permissions(
      relabelled_key, std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  const auto refused_at_handshake = [&](const std::string& what) {
    SCOPED_TRACE(what);
    const Finished f = Operator({"jobs"}, relabelled_key);
    EXPECT_EQ(f.exit_code, 1) << f.log;
    EXPECT_NE(f.log.find("refused this key"), std::string::npos) << f.log;
  };
  refused_at_handshake("a client key presented to the operators' endpoint");
  // ...with its .pub copied into the operators' directory (skipped: its role is client)...
  std::filesystem::copy_file(dir_ + "/keys/allowed/site-0.pub",
                             dir_ + "/operators-allowed/site-0.pub");
  refused_at_handshake("a client's .pub in the operators' directory");
  EXPECT_TRUE(WaitFor(
      [&] {
        return ReadAll(dir_ + "/serve.log")
                   .find(
                       "operators-allowed/site-0.pub: role is 'client'; the operators' "
                       "allow-list takes only operator keys (`huddle keygen operator`)") !=
               std::string::npos;
      },
      seconds(10)))
      << ReadAll(dir_ + "/serve.log");
  // ...and with that .pub relabelled too (refused: the key is enrolled as a client).
  std::string relabelled_pub = ReadAll(dir_ + "/keys/allowed/site-0.pub");
  relabelled_pub.replace(relabelled_pub.find("role: client"), 12, "role: operator");
  std::filesystem::remove(dir_ + "/operators-allowed/site-0.pub");
  WriteText(dir_ + "/operators-allowed/site-0.pub", relabelled_pub);
  refused_at_handshake("a client's .pub relabelled as an operator's");
  EXPECT_TRUE(WaitFor(
      [&] {
        const std::string log = ReadAll(dir_ + "/serve.log");
        return log.find("is enrolled both as operator 'site-0' (" + dir_ +
                        "/operators-allowed/site-0.pub) and as client 'site-0' (" + dir_ +
                        "/keys/allowed/site-0.pub)") != std::string::npos;
      },
      seconds(10)))
      << ReadAll(dir_ + "/serve.log");
  std::filesystem::remove(dir_ + "/operators-allowed/site-0.pub");
  // Hostile or wrong submissions: refused, naming what, and nothing is stored.
  struct Case {
    std::string yaml;
    std::string error;
  };
  const Case cases[] = {
      {"name: ../../etc\ndata: {name: fmnist}\n", "a submitted job needs a name"},
      {"name: a1\ndata: {name: fmnist}\nevaluation: {data: /etc}\n", "evaluation.data"},
      {"name: a2\ndata: {name: fmnist}\nmodel: {kind: mlp, file: ../../../etc/passwd}\n",
       "model.file"},
      {"name: a3\ndata: {name: fmnist}\noutput: {dir: /tmp}\n", "'output' is not allowed"},
      {"name: a4\ndata: {name: fmnist}\nsecurity: {allowed_clients: /}\n",
       "'security' is not allowed"},
      {"name: a5\ndata: {name: fmnist, path: /etc}\n", "data.path is not allowed"},
      {"name: a6\nrounds: 1000000000000\ndata: {name: fmnist}\n", "rounds"},
      {"name: a7\n", "data.name"},
      {"name: a8\ndata: {name: fmnist}\nbogus_key: 1\n", "bogus_key"},
      {"[not, a, mapping]\n", "not a YAML mapping"},
      {std::string(2 << 20, 'x'), ""},
  };
  int i = 0;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.yaml.substr(0, 80));
    const std::string path = dir_ + "/hostile-" + std::to_string(i++) + ".yaml";
    WriteText(path, c.yaml);
    const Finished f = Operator({"submit", path});
    EXPECT_EQ(f.exit_code, 2) << f.log;
    EXPECT_NE(f.log.find(c.error), std::string::npos) << f.log;
  }
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/state/jobs/a1"));
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/etc"));
  const Finished jobs = Operator({"jobs", "--json"});
  ASSERT_EQ(jobs.exit_code, 0) << jobs.log;
  EXPECT_EQ(nlohmann::json::parse(jobs.log.substr(jobs.log.find('{')))["jobs"].size(), 0u);
  // Names are never reused; an unknown job is the operator's error.
  ASSERT_EQ(Operator({"submit", WriteJobFile("once", 2)}).exit_code, 0);
  EXPECT_EQ(Operator({"submit", WriteJobFile("once", 2)}).exit_code, 2);
  EXPECT_EQ(Operator({"status", "nope"}).exit_code, 2);
  EXPECT_EQ(Operator({"stop", "../x"}).exit_code, 2);
}

TEST_F(ServiceTest, AStoppedJobEndsForGoodAndTheNextOneRuns) {
  auto service = StartService();
  std::vector<std::unique_ptr<Process>> agents;
  for (int i = 0; i < 3; ++i) agents.push_back(StartAgent(i));
  ASSERT_EQ(Operator({"submit", WriteJobFile("endless", 100000)}).exit_code, 0);
  ASSERT_EQ(Operator({"submit", WriteJobFile("after", 2)}).exit_code, 0);
  ASSERT_TRUE(WaitFor([&] { return ReadLines(Out("endless") + "/metrics.jsonl").size() >= 2; },
                      seconds(120)));
  const Finished stop = Operator({"stop", "endless"});
  ASSERT_EQ(stop.exit_code, 0) << stop.log;
  ASSERT_TRUE(WaitForState("endless", "stopped", seconds(60)));
  ASSERT_TRUE(WaitForState("after", "completed", seconds(120))) << ReadAll(dir_ + "/serve.log");
  const Finished logs = Operator({"logs", "endless"});
  EXPECT_EQ(logs.exit_code, 0);
  EXPECT_NE(logs.log.find("round 1/100000"), std::string::npos) << logs.log.substr(0, 2000);
  EXPECT_EQ(Operator({"stop", "endless"}).exit_code, 1) << "it has already stopped";
}

// examples/service/ as shipped (shortened to three agents and two rounds), over plaintext so that
// it needs none of the keys it names.
TEST_F(ServiceTest, TheShippedServiceExamplesRun) {
  const std::string examples = std::string(HUDDLE_SOURCE_DIR) + "/examples/service";
  const std::string ops = "tcp://127.0.0.1:" + std::to_string(operators_port_);
  const std::string agents_at = "tcp://127.0.0.1:" + std::to_string(agents_port_);
  Process service({HuddleBin(), "serve", "--config", examples + "/server.yaml", "--state-dir",
                   dir_ + "/state", "--bind", agents_at, "--operator-bind", ops, "--http-bind",
                   "127.0.0.1:" + std::to_string(FreeLoopbackPort()), "--insecure"},
                  dir_ + "/serve.log");
  std::vector<std::unique_ptr<Process>> agents;
  for (int i = 0; i < 3; ++i) {
    // The example agent, as three sites: its client id and shard changed.
    std::string yaml = ReadAll(examples + "/agent.yaml");
    yaml.replace(yaml.find("client_id: site-a"), 17, "client_id: site-" + std::to_string(i));
    yaml.replace(yaml.find("shard: 0"), 8, "shard: " + std::to_string(i));
    const std::string path = dir_ + "/example-agent-" + std::to_string(i) + ".yaml";
    WriteText(path, yaml);
    agents.push_back(
        std::make_unique<Process>(std::vector<std::string>{HuddleBin(), "agent", "--config", path,
                                                           "--service", agents_at, "--insecure"},
                                  dir_ + "/agent-" + std::to_string(i) + ".log"));
  }
  std::string job = ReadAll(examples + "/job.yaml");
  for (const auto& [from, to] :
       std::vector<std::pair<std::string, std::string>>{{"rounds: 20", "rounds: 2"},
                                                        {"size: 10", "size: 3"},
                                                        {"quorum: 8", "quorum: 3"},
                                                        {"min_clients: 10", "min_clients: 3"}}) {
    ASSERT_NE(job.find(from), std::string::npos) << from;
    job.replace(job.find(from), from.size(), to);
  }
  WriteText(dir_ + "/example-job.yaml", job);
  const Finished submit =
      RunToEnd({HuddleBin(), "submit", dir_ + "/example-job.yaml", "--service", ops, "--insecure"},
               dir_ + "/submit.log", seconds(30));
  ASSERT_EQ(submit.exit_code, 0) << submit.log;
  ASSERT_TRUE(WaitFor(
      [&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(450));
        const Finished f = RunToEnd({HuddleBin(), "jobs", "--service", ops, "--insecure"},
                                    dir_ + "/jobs.log", seconds(30));
        return f.log.find("completed") != std::string::npos;
      },
      seconds(120)))
      << ReadAll(dir_ + "/serve.log");
  const auto metrics = ReadLines(dir_ + "/state/jobs/fmnist-service/out/metrics.jsonl");
  ASSERT_EQ(metrics.size(), 2u);
  EXPECT_GT(nlohmann::json::parse(metrics[1])["test_accuracy"].get<double>(), 0.5);
}

}  // namespace
}  // namespace huddle::testing
