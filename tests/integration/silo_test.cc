// Integration tests: a silo (`silo.nproc: 2`, two CPU ranks in one `huddle client` process)
// joins a federation of real `huddle` processes on 127.0.0.1 as one client.
#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "tests/integration/job_yaml.h"
#include "tests/integration/process.h"

namespace huddle::testing {
namespace {

using std::chrono::seconds;

constexpr const char* kFashionMnist = "/usr/share/datasets/fashion-mnist";

class SiloFederationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(std::string(kFashionMnist) + "/train-images-idx3-ubyte.gz")) {
      GTEST_SKIP() << "Fashion-MNIST is not installed (Debian package dataset-fashion-mnist)";
    }
  }

  static std::vector<nlohmann::json> Metrics(const std::string& out) {
    std::vector<nlohmann::json> metrics;
    for (const std::string& line : ReadLines(out + "/metrics.jsonl")) {
      metrics.push_back(nlohmann::json::parse(line));
    }
    return metrics;
  }

  // Every round of a 2-round job had `clients` results and changed the model.
  static void ExpectRoundsCompleted(const std::string& out, int clients) {
    const auto metrics = Metrics(out);
    ASSERT_EQ(metrics.size(), 2u);
    for (size_t r = 0; r < metrics.size(); ++r) {
      EXPECT_EQ(metrics[r]["round"], r + 1);
      EXPECT_EQ(metrics[r]["results"], clients);
      EXPECT_EQ(metrics[r]["dropped"], 0);
      EXPECT_TRUE(metrics[r]["updated"].get<bool>());
      EXPECT_GT(metrics[r]["test_accuracy"].get<double>(), 0.5);
    }
  }
};

TEST_F(SiloFederationTest, ASiloClientAndAPlainClientCompleteTheRounds) {
  const std::string dir = MakeTempDir("silo");
  ASSERT_TRUE(cli::GenerateLocalKeys(dir + "/keys", {"plain", "silo"}).ok());
  JobYaml()
      .Set("name", "silo")
      .Set("seed", 3)
      .Set("rounds", 2)
      .Set("model.hidden", "[32]")
      .Set("train.epochs", 1)
      .Set("train.batch_size", 64)
      .Set("train.learning_rate", 0.1)
      .Set("cohort.size", 2)
      .Set("round.deadline_s", 60)
      .Set("round.quorum", 2)
      .Set("evaluation.every", 1)
      .Set("coordinator.min_clients", 2)
      .Set("coordinator.wait_for_clients_s", 60)
      .Set("coordinator.heartbeat_interval_s", 0.5)
      .Set("security.server_secret_key", dir + "/keys/server.key")
      .Set("security.allowed_clients", dir + "/keys/allowed")
      .Write(dir + "/job.yaml");
  // The silo reads its settings from a client YAML; both clients hold 1/20 of the data.
  ClientYaml(dir + "/keys", "silo", 1)
      .Set("device", "cpu")
      .Set("silo.nproc", 2)
      .Write(dir + "/silo.yaml");
  const std::string endpoint = "tcp://127.0.0.1:" + std::to_string(FreeLoopbackPort());
  Process coordinator({HuddleBin(), "coordinator", "--config", dir + "/job.yaml", "--out",
                       dir + "/out", "--bind", endpoint},
                      dir + "/coordinator.log");
  Process plain({HuddleBin(),
                 "client",
                 "--coordinator",
                 endpoint,
                 "--client-id",
                 "plain",
                 "--data",
                 kFashionMnist,
                 "--partition",
                 "iid",
                 "--num-shards",
                 "20",
                 "--shard",
                 "0",
                 "--partition-seed",
                 "1",
                 "--give-up-after",
                 "60",
                 "--device",
                 "cpu",
                 "--server-key",
                 dir + "/keys/server.pub",
                 "--key",
                 dir + "/keys/clients/plain.key"},
                dir + "/plain.log");
  Process silo({HuddleBin(), "client", "--config", dir + "/silo.yaml", "--coordinator", endpoint},
               dir + "/silo.log");
  ASSERT_EQ(coordinator.Wait(seconds(180)), 0)
      << ReadAll(dir + "/coordinator.log") << ReadAll(dir + "/silo.log");
  ExpectRoundsCompleted(dir + "/out", 2);
  EXPECT_EQ(silo.Wait(seconds(20)), 0) << ReadAll(dir + "/silo.log");
  EXPECT_EQ(plain.Wait(seconds(20)), 0) << ReadAll(dir + "/plain.log");
  const std::string log = ReadAll(dir + "/silo.log");
  EXPECT_NE(log.find("training as a silo: 2 x cpu"), std::string::npos) << log;
  EXPECT_NE(log.find("round 2: trained"), std::string::npos) << log;
}

TEST_F(SiloFederationTest, HuddleRunStartsItsClientsAsSilos) {
  const std::string dir = MakeTempDir("silo_run");
  JobYaml()
      .Set("name", "silo-run")
      .Set("seed", 4)
      .Set("rounds", 2)
      .Set("model.hidden", "[16]")
      .Set("train.epochs", 1)
      .Set("train.batch_size", 128)
      .Set("train.learning_rate", 0.1)
      .Set("clients", 1)
      .Set("cohort.size", 1)
      .Set("evaluation.every", 1)
      .Set("client.device", "cpu")
      .Set("client.silo.nproc", 2)
      .Write(dir + "/job.yaml");
  Process run({HuddleBin(), "run", dir + "/job.yaml", "--out", dir + "/out"}, dir + "/run.log");
  ASSERT_EQ(run.Wait(seconds(240)), 0)
      << ReadAll(dir + "/run.log") << ReadAll(dir + "/out/logs/client-000.log");
  ExpectRoundsCompleted(dir + "/out", 1);
  const std::string log = ReadAll(dir + "/out/logs/client-000.log");
  EXPECT_NE(log.find("training as a silo: 2 x cpu"), std::string::npos) << log;
}

}  // namespace
}  // namespace huddle::testing
