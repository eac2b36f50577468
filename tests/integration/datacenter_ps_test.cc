// `huddle datacenter` in the parameter-server mode with real processes on 127.0.0.1: a worker
// killed mid-run (the job finishes without it, and says so), a resume from the checkpoint, and
// refusals of layouts that cannot work.
#include <gtest/gtest.h>

#include <filesystem>

#include "tests/integration/datacenter_job.h"
#include "tests/integration/process.h"

namespace huddle::testing {
namespace {

using std::chrono::seconds;

std::string PsConfig(const std::string& dir, const std::string& name, int epochs,
                     const std::string& ps, double timeout_s = 30) {
  DcJob job;
  job.epochs = epochs;
  job.timeout_s = timeout_s;
  job.datacenter = "parameter_server: {" + ps + "}";
  return WriteJob(dir, name, job);
}

TEST(DatacenterParameterServer, AKilledWorkerIsDeclaredDeadAndTrainingFinishes) {
  const std::string dir = MakeTempDir("dc_ps_kill");
  // Ranks 0-1 serve, 2-4 work; rank 4 kills itself after 10 steps. 1200 rows, batch 8: 150
  // batches an epoch.
  const std::string config = PsConfig(dir, "kill", 3,
                                      "servers: 2, mode: async, staleness_bound: 8, "
                                      "kill_for_testing: {rank: 4, after_steps: 10}",
                                      /*timeout_s=*/2);
  const Finished p = RunToEnd(Launcher(config, dir + "/out", 5), dir + "/run.log", seconds(120));
  ASSERT_EQ(p.exit_code, 0) << p.log;
  EXPECT_NE(p.log.find("worker rank 4 exited"), std::string::npos) << p.log;
  EXPECT_NE(p.log.find("dead worker rank(s) 4"), std::string::npos) << p.log;
  const auto summary = JsonFile(dir + "/out/summary.json");
  EXPECT_EQ(summary["mode"], "parameter_server");
  EXPECT_EQ(summary["ps_mode"], "async");
  EXPECT_EQ(summary["dead_workers"], nlohmann::json::array({4}));
  EXPECT_EQ(summary["gradients_counted"].get<int64_t>(), 3 * 150);
  EXPECT_GT(summary["train_accuracy"].get<double>(), 0.8);
  const auto metrics = JsonLines(dir + "/out/metrics.jsonl");
  ASSERT_EQ(metrics.size(), 3u);
  EXPECT_EQ(metrics.back()["mode"], "parameter_server");
  EXPECT_TRUE(std::filesystem::exists(dir + "/out/model.bin"));
  std::filesystem::remove_all(dir);
}

TEST(DatacenterParameterServer, ResumesFromTheServersCheckpoint) {
  const std::string dir = MakeTempDir("dc_ps_resume");
  const std::string ps = "servers: 2, mode: sync";
  const Finished first = RunToEnd(Launcher(PsConfig(dir, "one", 1, ps), dir + "/out", 4),
                                  dir + "/first.log", seconds(120));
  ASSERT_EQ(first.exit_code, 0) << first.log;
  const auto one = JsonFile(dir + "/out/summary.json");
  // Two more epochs on top of the first one's checkpoint.
  std::vector<std::string> argv = Launcher(PsConfig(dir, "three", 3, ps), dir + "/out", 4);
  argv.push_back("--resume");
  const Finished resumed = RunToEnd(argv, dir + "/resumed.log", seconds(120));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.log;
  EXPECT_NE(resumed.log.find("resuming after epoch 1"), std::string::npos) << resumed.log;
  const auto metrics = JsonLines(dir + "/out/metrics.jsonl");
  ASSERT_EQ(metrics.size(), 3u);
  EXPECT_EQ(metrics[0]["epoch"], 1);
  EXPECT_EQ(metrics[2]["epoch"], 3);
  // Sync, 2 workers x 8 rows: 75 steps an epoch, counted on from the checkpoint.
  EXPECT_EQ(one["steps"].get<int64_t>(), 75);
  EXPECT_EQ(metrics[2]["steps"].get<int64_t>(), 225);
  EXPECT_LT(metrics[2]["train_loss"].get<double>(), metrics[0]["train_loss"].get<double>());
  // A resume of the finished job changes nothing.
  const Finished again = RunToEnd(argv, dir + "/again.log", seconds(60));
  EXPECT_EQ(again.exit_code, 0) << again.log;
  EXPECT_NE(again.log.find("already complete"), std::string::npos) << again.log;
  std::filesystem::remove_all(dir);
}

TEST(DatacenterParameterServer, RefusesALayoutWithoutWorkersOrWithTooManyBackups) {
  const std::string dir = MakeTempDir("dc_ps_refuse");
  const Finished servers =
      RunToEnd(Launcher(PsConfig(dir, "servers", 1, "servers: 2"), dir + "/a", 2), dir + "/a.log",
               seconds(60));
  EXPECT_EQ(servers.exit_code, 1) << servers.log;  // the launcher quotes the refusing rank
  EXPECT_NE(servers.log.find("at least one rank must be left for a worker"), std::string::npos)
      << servers.log;
  const Finished backups = RunToEnd(
      Launcher(PsConfig(dir, "backups", 1, "mode: sync, backup_workers: 2"), dir + "/b", 3),
      dir + "/b.log", seconds(60));
  EXPECT_NE(backups.exit_code, 0);
  EXPECT_NE(backups.log.find("backup_workers is 2 with 2 workers"), std::string::npos)
      << backups.log;
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace huddle::testing
