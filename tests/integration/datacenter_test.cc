// Integration tests of `huddle datacenter`: real rank processes on 127.0.0.1, started by the
// launcher (--nproc) or one by one as on several hosts (--rank/--world-size/--rendezvous).
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tests/integration/datacenter_job.h"
#include "tests/integration/process.h"

namespace huddle::testing {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

// `dp_sgd`, when given, is the body of train.dp_sgd (e.g. "noise_multiplier: 1, ...").
std::string WriteConfig(const std::string& dir, int epochs, double timeout_s = 30,
                        const std::string& dp_sgd = "") {
  DcJob job;
  job.epochs = epochs;
  job.timeout_s = timeout_s;
  job.dp_sgd = dp_sgd;
  return WriteJob(dir, "dc-" + std::to_string(epochs) + (dp_sgd.empty() ? "" : "-dp"), job);
}

std::vector<nlohmann::json> Metrics(const std::string& out) {
  return JsonLines(out + "/metrics.jsonl");
}

TEST(DatacenterCommand, TwoRanksTrainAndAResumedJobEndsWithTheSameModel) {
  const std::string dir = MakeTempDir("dc_resume");
  const std::string three = WriteConfig(dir, 3);
  const Finished straight =
      RunToEnd(Launcher(three, dir + "/straight", 2), dir + "/straight.log", seconds(120));
  ASSERT_EQ(straight.exit_code, 0) << straight.log;
  const auto metrics = Metrics(dir + "/straight");
  ASSERT_EQ(metrics.size(), 3u) << ReadAll(dir + "/straight.log");
  EXPECT_EQ(metrics[2]["steps"], 3 * (1200 / 16));
  EXPECT_LT(metrics[2]["train_loss"].get<double>(), metrics[0]["train_loss"].get<double>());
  const auto summary = nlohmann::json::parse(ReadAll(dir + "/straight/summary.json"));
  EXPECT_EQ(summary["world_size"], 2);
  EXPECT_EQ(summary["backend"], "gloo");
  EXPECT_GE(summary["replica_checks_passed"].get<int>(), 3 * 75 / 10);

  // The same job stopped after one epoch (its checkpoint is the state after epoch 1), then
  // resumed for the remaining two: the model file is byte-for-byte the uninterrupted one.
  const Finished first = RunToEnd(Launcher(WriteConfig(dir, 1), dir + "/resumed", 2),
                                  dir + "/first.log", seconds(120));
  ASSERT_EQ(first.exit_code, 0) << first.log;
  std::vector<std::string> argv = Launcher(three, dir + "/resumed", 2);
  argv.push_back("--resume");
  const Finished resumed = RunToEnd(argv, dir + "/resumed.log", seconds(120));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.log;
  EXPECT_EQ(ReadAll(dir + "/resumed/model.bin"), ReadAll(dir + "/straight/model.bin"));
  const auto resumed_metrics = Metrics(dir + "/resumed");
  ASSERT_EQ(resumed_metrics.size(), 3u);
  EXPECT_EQ(resumed_metrics[2]["train_loss"], metrics[2]["train_loss"]);
}

// Ranks started one by one, as on several hosts; rank 0 serves the rendezvous. Killing one rank
// mid-training ends the others with an error well within a bound, never a hang.
TEST(DatacenterCommand, KillingOneRankEndsTheOthersWithAnError) {
  const std::string dir = MakeTempDir("dc_kill");
  const std::string config = WriteConfig(dir, 1000, /*timeout_s=*/5);
  const std::string rendezvous = "tcp://127.0.0.1:" + std::to_string(FreeLoopbackPort());
  const std::string key = MakeRendezvousKey(dir);
  ASSERT_FALSE(key.empty()) << ReadAll(dir + "/keygen.log");
  std::vector<std::unique_ptr<Process>> ranks;
  for (int r = 0; r < 3; ++r) {
    ranks.push_back(std::make_unique<Process>(
        WithEnv({KeyEnv(key)}, {HuddleBin(), "datacenter", "--config", config, "--out",
                                dir + "/out", "--rank", std::to_string(r), "--world-size", "3",
                                "--rendezvous", rendezvous, "--run-id", "kill-test"}),
        dir + "/rank-" + std::to_string(r) + ".log"));
  }
  ASSERT_TRUE(WaitFor([&] { return Metrics(dir + "/out").size() >= 2; }, milliseconds(60000)))
      << ReadAll(dir + "/rank-0.log");
  ranks[1]->Kill(SIGKILL);
  const auto killed = std::chrono::steady_clock::now();
  for (int r : {0, 2}) {
    const int code = ranks[r]->Wait(seconds(30));
    const std::string log = ReadAll(dir + "/rank-" + std::to_string(r) + ".log");
    EXPECT_EQ(code, 1) << "rank " << r << ":\n" << log;
    EXPECT_NE(log.find("huddle datacenter: rank " + std::to_string(r) + ": "), std::string::npos)
        << log;
  }
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - killed).count();
  EXPECT_LT(waited, 15.0) << "the survivors took " << waited << " s to stop (timeout 5 s)";
  // The checkpoint of the last whole epoch is there to resume from.
  EXPECT_FALSE(ReadAll(dir + "/out/checkpoint.bin").empty());
}

TEST(DatacenterCommand, ARankThatNeverComesIsNamed) {
  const std::string dir = MakeTempDir("dc_missing");
  const std::string config = WriteConfig(dir, 1, /*timeout_s=*/2);
  const Finished rank0 =
      RunToEnd(WithEnv({kInsecureRendezvous},
                       {HuddleBin(), "datacenter", "--config", config, "--out", dir + "/out",
                        "--rank", "0", "--world-size", "2", "--rendezvous",
                        "tcp://127.0.0.1:" + std::to_string(FreeLoopbackPort())}),
               dir + "/rank-0.log", seconds(30));
  EXPECT_EQ(rank0.exit_code, 1);
  EXPECT_NE(ReadAll(dir + "/rank-0.log").find("rank(s) 1 did not join"), std::string::npos)
      << ReadAll(dir + "/rank-0.log");
}

TEST(DatacenterCommand, DpSgdAcrossRanksReportsItsSpendAndRefusesToExceedTheBudget) {
  const std::string dir = MakeTempDir("dc_dp");
  const std::string config = WriteConfig(
      dir, 2, 30, "noise_multiplier: 1.0, clip_norm: 1.0, expected_batch_size: 60, epsilon: 10");
  const Finished run = RunToEnd(Launcher(config, dir + "/out", 2), dir + "/run.log", seconds(120));
  ASSERT_EQ(run.exit_code, 0) << run.log;
  const auto metrics = Metrics(dir + "/out");
  ASSERT_EQ(metrics.size(), 2u) << ReadAll(dir + "/run.log");
  EXPECT_EQ(metrics[1]["steps"], 40);  // round(2 * 1200 / 60)
  EXPECT_GT(metrics[1]["epsilon"].get<double>(), metrics[0]["epsilon"].get<double>());
  const auto summary = nlohmann::json::parse(ReadAll(dir + "/out/summary.json"));
  EXPECT_EQ(summary["privacy"]["steps"], 40);
  EXPECT_DOUBLE_EQ(summary["privacy"]["sampling_rate"].get<double>(), 0.05);
  EXPECT_EQ(summary["privacy"]["noise_source"], "os-csprng");
  EXPECT_EQ(summary["privacy"]["epsilon"], metrics[1]["epsilon"]);
  EXPECT_LE(summary["privacy"]["epsilon"].get<double>(), 10.0);

  // Stopped after one epoch and resumed: the run continues at step 20 and accounts for all 40.
  const std::string dp = "noise_multiplier: 1.0, clip_norm: 1.0, expected_batch_size: 60";
  const Finished first = RunToEnd(Launcher(WriteConfig(dir, 1, 30, dp), dir + "/resumed", 2),
                                  dir + "/first.log", seconds(120));
  ASSERT_EQ(first.exit_code, 0) << first.log;
  std::vector<std::string> argv = Launcher(WriteConfig(dir, 2, 30, dp), dir + "/resumed", 2);
  argv.push_back("--resume");
  const Finished resumed = RunToEnd(argv, dir + "/resumed.log", seconds(120));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.log;
  const auto resumed_metrics = Metrics(dir + "/resumed");
  ASSERT_EQ(resumed_metrics.size(), 2u);
  EXPECT_EQ(resumed_metrics[1]["steps"], 40);
  const auto resumed_summary = nlohmann::json::parse(ReadAll(dir + "/resumed/summary.json"));
  EXPECT_EQ(resumed_summary["privacy"]["steps"], 40);
  EXPECT_EQ(resumed_summary["privacy"]["epsilon"], summary["privacy"]["epsilon"]);

  // An expected batch that does not divide the data: ceil(1200 / 1100) = 2 steps make a report
  // "epoch", round(3 * 1200 / 1100) = 3 steps the run; its last report still writes the model.
  const Finished odd =
      RunToEnd(Launcher(WriteConfig(dir, 3, 30,
                                    "noise_multiplier: 1.0, clip_norm: 1.0, expected_batch_size: "
                                    "1100"),
                        dir + "/odd", 2),
               dir + "/odd.log", seconds(120));
  ASSERT_EQ(odd.exit_code, 0) << odd.log;
  const auto odd_metrics = Metrics(dir + "/odd");
  ASSERT_EQ(odd_metrics.size(), 2u) << ReadAll(dir + "/odd.log");
  EXPECT_EQ(odd_metrics[1]["steps"], 3);
  EXPECT_FALSE(ReadAll(dir + "/odd/model.bin").empty());

  // A budget the run would exceed: refused before any step, with the noise that would fit.
  const std::string tight = WriteConfig(
      dir, 2, 30, "noise_multiplier: 0.5, clip_norm: 1.0, expected_batch_size: 60, epsilon: 1");
  const Finished refused =
      RunToEnd(Launcher(tight, dir + "/tight", 2), dir + "/tight.log", seconds(60));
  EXPECT_EQ(refused.exit_code, 1);
  const std::string log = refused.log;
  EXPECT_NE(log.find("over the budget of 1"), std::string::npos) << log;
  EXPECT_NE(log.find("would fit"), std::string::npos) << log;
  EXPECT_TRUE(Metrics(dir + "/tight").empty());
}

TEST(DatacenterCommand, BadInvocationsAreRefusedWithTheReason) {
  const std::string dir = MakeTempDir("dc_bad");
  const std::string config = WriteConfig(dir, 1);
  struct Case {
    std::vector<std::string> args;
    int code;
    std::string says;
  };
  WriteText(dir + "/typo.yaml", "train: {epoch: 3}\n");
  const std::vector<Case> cases = {
      {{"--config", dir + "/typo.yaml"}, 2, "epoch"},
      {{"--config", config, "--rank", "0"}, 2, "--world-size"},
      {{"--config", config, "--nproc", "2", "--rank", "0", "--world-size", "2", "--rendezvous",
        "file://" + dir + "/rv"},
       2,
       "does not combine"},
      {{"--config", config, "--out", dir + "/none", "--nproc", "1", "--resume"}, 1, "checkpoint"},
      {{"--config", config, "--device", "tpu"}, 2, "tpu"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    std::vector<std::string> argv = {HuddleBin(), "datacenter"};
    argv.insert(argv.end(), cases[i].args.begin(), cases[i].args.end());
    const std::string log = dir + "/case-" + std::to_string(i) + ".log";
    Process p(argv, log);
    EXPECT_EQ(p.Wait(seconds(60)), cases[i].code) << "case " << i << ": " << ReadAll(log);
    EXPECT_NE(ReadAll(log).find(cases[i].says), std::string::npos)
        << "case " << i << ": " << ReadAll(log);
  }
}

}  // namespace
}  // namespace huddle::testing
