// The `huddle` binary refuses, before any round and naming the key, the jobs that used to start
// and fail later: a CSV model's job with no evaluation.data (it defaulted to Fashion-MNIST and
// failed after round 1), a test set whose width is not the model's, and a DP plan whose rounds
// cannot all run within privacy.epsilon. Refusals of the job file exit 2 (a usage error).
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "tests/integration/process.h"

namespace huddle::testing {
namespace {

using std::chrono::seconds;

constexpr const char* kFashionMnist = "/usr/share/datasets/fashion-mnist";

class StartRefusalTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = MakeTempDir("start_refusal"); }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // `huddle ARGS...`, to its end (at most 60 s).
  Finished Huddle(const std::vector<std::string>& args) {
    std::vector<std::string> argv = {HuddleBin()};
    argv.insert(argv.end(), args.begin(), args.end());
    return RunToEnd(argv, dir_ + "/huddle" + std::to_string(runs_++) + ".log", seconds(60));
  }
  Finished Coordinator(const std::string& job) {
    return Huddle({"coordinator", "--config", job, "--insecure", "--out", dir_ + "/out", "--bind",
                   "tcp://127.0.0.1:" + std::to_string(FreeLoopbackPort())});
  }
  Finished Run(const std::string& job) {
    return Huddle({"run", job, "--out", dir_ + "/run" + std::to_string(runs_)});
  }

  // A 20-feature, 2-class CSV job (the issue's `csv20`) with `extra` YAML appended.
  std::string Csv20Job(const std::string& extra) {
    std::string csv;
    for (int row = 0; row < 40; ++row) {
      csv += std::to_string(row % 2);
      for (int f = 0; f < 20; ++f) csv += f == row % 20 ? ",1" : ",0";
      csv += "\n";
    }
    WriteText(dir_ + "/train.csv", csv);
    const std::string path = dir_ + "/job.yaml";
    WriteText(path,
              "name: csv20\nrounds: 2\nclients: 2\n"
              "model: {input_dim: 20, hidden: [8], num_classes: 2}\n"
              "cohort: {size: 2}\n"
              "data: {path: train.csv, format: csv, num_classes: 2}\n" +
                  extra);
    return path;
  }

  std::string dir_;
  int runs_ = 0;
};

TEST_F(StartRefusalTest, ACsvModelsJobWithoutEvaluationDataIsRefusedAtStart) {
  const std::string job = Csv20Job("");
  for (const Finished& f : {Coordinator(job), Run(job)}) {
    EXPECT_EQ(f.exit_code, 2) << f.log;
    EXPECT_NE(f.log.find("evaluation.data is required for a model whose input is not "
                         "Fashion-MNIST's 28x28 (the model's input is [20], 20 features)"),
              std::string::npos)
        << f.log;
    EXPECT_EQ(f.log.find("round 1"), std::string::npos) << f.log;
  }
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/out/metrics.jsonl"));
}

TEST_F(StartRefusalTest, ATestSetOfAnotherWidthIsRefusedBeforeAnyClientJoins) {
  if (!std::filesystem::exists(kFashionMnist)) {
    GTEST_SKIP() << kFashionMnist << " is not installed";
  }
  // Given explicitly: an IDX test set's width is known once it is read, when the coordinator
  // starts (not after round 1, and without waiting for clients).
  const Finished f = Coordinator(
      Csv20Job(std::string("evaluation: {data: ") + kFashionMnist + ", format: idx}\n"));
  EXPECT_EQ(f.exit_code, 1) << f.log;
  EXPECT_NE(f.log.find(std::string("evaluation.data: ") + kFashionMnist +
                       " has 784 features per example; the model (mlp 20-8-2) expects 20"),
            std::string::npos)
      << f.log;
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/out/metrics.jsonl"));
}

TEST_F(StartRefusalTest, ADpPlanThatCannotRunAllItsRoundsIsRefusedWithWhatFits) {
  const std::string job = dir_ + "/dp.yaml";
  WriteText(job,
            "rounds: 40\nsimulation: {clients: 20}\n"
            "cohort: {sampling: poisson, rate: 0.5}\n"
            "privacy: {mode: central, epsilon: 3, delta: 1.0e-5, "
            "schedule: [{rounds: [1, 40], noise_multiplier: 2.0}]}\n");
  const Finished f = Run(job);
  EXPECT_EQ(f.exit_code, 2) << f.log;
  EXPECT_NE(f.log.find("privacy.epsilon: 40 rounds at noise_multiplier 2 spend epsilon"),
            std::string::npos)
      << f.log;
  EXPECT_NE(f.log.find(" rounds fit (rounds: "), std::string::npos) << f.log;
  EXPECT_NE(f.log.find("privacy.stop_at_budget: true"), std::string::npos) << f.log;
}

}  // namespace
}  // namespace huddle::testing
