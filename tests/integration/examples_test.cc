// Every shipped example job runs, shortened (fewer rounds or epochs; the CNN also narrower
// layers), with the real binary: it must exit 0, have work accepted in every round, and move the
// metric above chance; a DP example must also state a private guarantee within its budget in
// privacy.json.
// Examples rot unless they run.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "tests/integration/process.h"

namespace huddle::testing {
namespace {

using std::chrono::seconds;

struct Example {
  std::string file;  // under examples/
  bool datacenter = false;
  // Textual edits that shorten the run: (text, replacement), every occurrence.
  std::vector<std::pair<std::string, std::string>> shorten;
  bool dp = false;
  double budget_epsilon = 0;   // the example's total, checked against privacy.json
  bool client_dp_sgd = false;  // DP-SGD inside the clients: each keeps its own ledger
};

std::ostream& operator<<(std::ostream& os, const Example& e) { return os << e.file; }

std::vector<nlohmann::json> JsonLinesOf(const std::string& path) {
  std::vector<nlohmann::json> out;
  for (const std::string& line : ReadLines(path)) out.push_back(nlohmann::json::parse(line));
  return out;
}

class ExamplesTest : public ::testing::TestWithParam<Example> {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz")) {
      GTEST_SKIP() << "Fashion-MNIST is not installed (Debian package dataset-fashion-mnist)";
    }
  }
};

TEST_P(ExamplesTest, RunsShortenedWithWorkAcceptedAndTheMetricMoving) {
  const Example& e = GetParam();
  const std::string dir = MakeTempDir("example_" + e.file);
  std::string yaml = ReadAll(std::string(HUDDLE_SOURCE_DIR) + "/examples/" + e.file);
  for (const auto& [text, replacement] : e.shorten) {
    size_t at = yaml.find(text);
    ASSERT_NE(at, std::string::npos)
        << e.file << ": the shortening '" << text << "' matches nothing";
    for (; at != std::string::npos; at = yaml.find(text, at + replacement.size())) {
      yaml.replace(at, text.size(), replacement);
    }
  }
  const std::string config = dir + "/" + e.file;
  WriteText(config, yaml);
  const std::string out = dir + "/out";
  std::vector<std::string> argv =
      e.datacenter
          ? std::vector<std::string>{HuddleBin(), "datacenter", "--config", config, "--out", out}
          : std::vector<std::string>{HuddleBin(), "run", config, "--out", out};
  const Finished p = RunToEnd(argv, dir + "/log", seconds(400));
  ASSERT_EQ(p.exit_code, 0) << p.log;

  const auto metrics = JsonLinesOf(out + "/metrics.jsonl");
  ASSERT_FALSE(metrics.empty()) << ReadAll(dir + "/log");
  // Work accepted: every round folded results (federated), or steps were taken (datacenter).
  if (e.datacenter) {
    EXPECT_GT(metrics.back()["steps"].get<int64_t>(), 0);
  } else {
    const auto counts = e.dp ? JsonLinesOf(out + "/operator_metrics.jsonl") : metrics;
    ASSERT_EQ(counts.size(), metrics.size());
    for (const auto& m : counts) EXPECT_GT(m["results"].get<int64_t>(), 0) << m.dump();
  }
  // The metric moved: the last evaluation is well above chance (0.1 for ten classes).
  double accuracy = 0;
  for (const auto& m : metrics) {
    if (m.contains("test_accuracy") && m["test_accuracy"].is_number()) {
      accuracy = m["test_accuracy"].get<double>();
    }
  }
  EXPECT_GT(accuracy, 0.3) << e.file;
  if (e.dp) {
    const auto report = nlohmann::json::parse(ReadAll(out + "/privacy.json"));
    EXPECT_EQ(report["private"], true) << report.dump(2);
    ASSERT_TRUE(report["epsilon"].is_number()) << report.dump(2);
    EXPECT_LE(report["epsilon"].get<double>(), e.budget_epsilon + 1e-9);
    EXPECT_FALSE(report["releases"].empty());
    EXPECT_FALSE(report["assumptions"].empty());
  }
  if (e.client_dp_sgd) {
    // huddle run gives each client the job's policy; the client accounts every round itself.
    const auto ledger = JsonLinesOf(out + "/clients/client-000/privacy_ledger.jsonl");
    ASSERT_EQ(ledger.size(), metrics.size());
    EXPECT_EQ(ledger[0]["unit"], "example");
    EXPECT_EQ(ledger[0]["noise"], "os-csprng");
    // The job's statement says so: example-level, each client's epsilon in its own ledger.
    const auto report = nlohmann::json::parse(ReadAll(out + "/privacy.json"));
    EXPECT_EQ(report["unit_of_privacy"], "example");
    EXPECT_TRUE(report["epsilon"].is_null());
    EXPECT_NE(report["epsilon_kept_by"].get<std::string>().find("ledger"), std::string::npos);
  }
  std::filesystem::remove_all(dir);
}

// The shipped client configuration, as the README uses it: a coordinator started from the
// quickstart job (shortened, with the security section it documents) and one client started from
// examples/client.yaml, its key paths relative to the file, run from another directory.
TEST_F(ExamplesTest, TheClientExampleJoinsACoordinatorAndTrains) {
  const std::string dir = MakeTempDir("example_client");
  const std::string keys = dir + "/keys";
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"keygen", "server", "--out", keys},
        std::vector<std::string>{"keygen", "client", "--id", "hospital-a", "--out", keys}}) {
    std::vector<std::string> argv = {HuddleBin()};
    argv.insert(argv.end(), args.begin(), args.end());
    const Finished p = RunToEnd(argv, dir + "/keygen.log", seconds(30));
    ASSERT_EQ(p.exit_code, 0) << p.log;
  }
  std::filesystem::create_directories(keys + "/allowed");
  std::filesystem::copy_file(keys + "/hospital-a.pub", keys + "/allowed/hospital-a.pub");
  const std::string endpoint = "tcp://127.0.0.1:" + std::to_string(FreeLoopbackPort());

  auto edit = [](std::string text, const std::vector<std::pair<std::string, std::string>>& e) {
    for (const auto& [from, to] : e) {
      const size_t at = text.find(from);
      EXPECT_NE(at, std::string::npos) << "'" << from << "' is no longer in the example";
      if (at != std::string::npos) text.replace(at, from.size(), to);
    }
    return text;
  };
  const std::string examples = std::string(HUDDLE_SOURCE_DIR) + "/examples/";
  WriteText(dir + "/job.yaml",
            edit(ReadAll(examples + "fashion_mnist.yaml"),
                 {{"rounds: 20", "rounds: 2"},
                  {"size: 10}", "size: 1}"},
                  {"quorum: 8", "quorum: 1"},
                  {"min_clients: 10", "min_clients: 1"},
                  {"# security:\n#   server_secret_key: keys/server.key",
                   "security:\n  server_secret_key: keys/server.key"},
                  {"#   allowed_clients: keys/allowed", "  allowed_clients: keys/allowed"}}));
  WriteText(dir + "/client.yaml",
            edit(ReadAll(examples + "client.yaml"),
                 {{"coordinator: tcp://127.0.0.1:5555", "coordinator: " + endpoint},
                  {"give_up_after_s: 0", "give_up_after_s: 60"}}));
  Process coordinator({HuddleBin(), "coordinator", "--config", dir + "/job.yaml", "--out",
                       dir + "/out", "--bind", endpoint},
                      dir + "/coordinator.log");
  Process client({HuddleBin(), "client", "--config", dir + "/client.yaml"}, dir + "/client.log");
  ASSERT_EQ(coordinator.Wait(seconds(180)), 0)
      << ReadAll(dir + "/coordinator.log") << ReadAll(dir + "/client.log");
  EXPECT_EQ(client.Wait(seconds(30)), 0) << ReadAll(dir + "/client.log");
  const auto metrics = JsonLinesOf(dir + "/out/metrics.jsonl");
  ASSERT_EQ(metrics.size(), 2u);
  for (const auto& m : metrics) EXPECT_EQ(m["results"], 1) << m.dump();
  EXPECT_GT(metrics.back()["test_accuracy"].get<double>(), 0.3);
  std::filesystem::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(
    Shipped, ExamplesTest,
    ::testing::Values(
        Example{"fashion_mnist.yaml", false, {{"rounds: 20", "rounds: 2"}}},
        Example{"dirichlet.yaml", false, {{"rounds: 20", "rounds: 2"}}},
        Example{"secure_aggregation.yaml", false, {{"rounds: 20", "rounds: 2"}}},
        // The CNN with narrower layers too: the same layer kinds, a fraction of the compute.
        Example{"fashion_mnist_cnn.yaml",
                false,
                {{"rounds: 30", "rounds: 1"},
                 {"{out: 16,", "{out: 4,"},
                 {"{out: 32,", "{out: 8,"},
                 {"{out: 128}", "{out: 32}"}}},
        Example{
            "simulation.yaml",
            false,
            {{"rounds: 30", "rounds: 2"}, {"evaluation: {every: 5}", "evaluation: {every: 1}"}}},
        // FedBuff on the virtual clock: 1000 clients, shortened to 30 server steps.
        Example{"fedbuff.yaml", false, {{"rounds: 1000", "rounds: 30"}}},
        Example{"fedbuff_processes.yaml", false, {{"rounds: 20", "rounds: 6"}}},
        Example{"fedbuff_dp.yaml", false, {{"rounds: 100", "rounds: 5"}}, true, 8.0},
        Example{"fedbuff_secagg.yaml", false, {{"rounds: 60", "rounds: 6"}}},
        Example{"dp_central.yaml",
                false,
                {{"rounds: 60", "rounds: 3"}, {"evaluation: {every: 5}", "evaluation: {every: 1}"}},
                true,
                8.0},
        // 300 clients instead of 1000: the same secure sum of the clients' noise shares.
        Example{"dp_distributed.yaml",
                false,
                {{"rounds: 60", "rounds: 3"},
                 {"{clients: 1000,", "{clients: 300,"},
                 {"size: 1000}", "size: 300}"},
                 {"evaluation: {every: 5}", "evaluation: {every: 1}"}},
                true,
                8.0},
        Example{"dp_schedule.yaml",
                false,
                {{"rounds: 40", "rounds: 3"},
                 {"rounds: [1, 20]", "rounds: [1, 1]"},
                 {"rounds: [21, 40]", "rounds: [2, 3]"},
                 {"evaluation: {every: 5}", "evaluation: {every: 1}"}},
                true,
                8.0},
        Example{"dp_sgd.yaml",
                false,
                {{"rounds: 40", "rounds: 2"}, {"evaluation: {every: 5}", "evaluation: {every: 1}"}},
                false,
                0,
                true},
        Example{"datacenter.yaml", true, {{"epochs: 5", "epochs: 1"}}},
        Example{"datacenter_ps.yaml", true, {{"epochs: 3", "epochs: 1"}}},
        Example{"datacenter_dp.yaml", true, {{"epochs: 40", "epochs: 2"}}, true, 3.0},
        // The DP CNN with narrower convolutions: the same layer kinds and privacy path.
        Example{"datacenter_dp_cnn.yaml",
                true,
                {{"epochs: 40", "epochs: 1"}, {"{out: 16,", "{out: 4,"}, {"{out: 32,", "{out: 8,"}},
                true,
                3.0},
        // The ScatterNet with 2 angles instead of 8 (9 channels, not 81: a 9x cheaper transform).
        Example{"datacenter_dp_scattering.yaml",
                true,
                {{"epochs: 40", "epochs: 1"},
                 {"angles: 8}", "angles: 2}"},
                 {"groups: 27", "groups: 9"}},
                true,
                3.0}),
    [](const ::testing::TestParamInfo<Example>& example) {
      return example.param.file.substr(0, example.param.file.find('.'));
    });

}  // namespace
}  // namespace huddle::testing
