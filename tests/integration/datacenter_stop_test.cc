// Integration tests of issue 18's item 8 with real processes: the rendezvous is authenticated (a
// stranger cannot join as a rank; a tcp:// rendezvous without a key is refused), and SIGTERM to
// `huddle datacenter --nproc` stops the job within a step, checkpoints, and --resume finishes it
// with the bits of an uninterrupted run.
#include <gtest/gtest.h>

#include <cstdio>
#include <nlohmann/json.hpp>
#include <thread>

#include "tests/integration/datacenter_job.h"
#include "tests/integration/process.h"

namespace huddle::testing {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

std::vector<std::string> Rank(const std::string& config, const std::string& out, int rank,
                              const std::string& rendezvous) {
  return {HuddleBin(), "datacenter",         "--config",     config, "--out",        out,
          "--rank",    std::to_string(rank), "--world-size", "2",    "--rendezvous", rendezvous};
}

// A stranger without the job's key starts first and tries to register as rank 1 (with data of
// the right shape); it never gets an answer, and the real rank 1 joins and the job completes.
TEST(DatacenterSecurity, AStrangerWithoutTheKeyCannotJoinAsARank) {
  const std::string dir = MakeTempDir("dc_stranger");
  DcJob job;
  job.epochs = 1;
  job.timeout_s = 5;
  const std::string config = WriteJob(dir, "job", job);
  const std::string key = MakeRendezvousKey(dir);
  ASSERT_FALSE(key.empty()) << ReadAll(dir + "/keygen.log");
  const std::string rendezvous = "tcp://127.0.0.1:" + std::to_string(FreeLoopbackPort());

  Process rank0(WithEnv({KeyEnv(key)}, Rank(config, dir + "/out", 0, rendezvous)),
                dir + "/rank-0.log");
  Process stranger(WithEnv({kInsecureRendezvous}, Rank(config, dir + "/stranger", 1, rendezvous)),
                   dir + "/stranger.log");
  // The stranger has had time to try before the real rank comes.
  std::this_thread::sleep_for(milliseconds(1000));
  Process rank1(WithEnv({KeyEnv(key)}, Rank(config, dir + "/out-1", 1, rendezvous)),
                dir + "/rank-1.log");
  EXPECT_EQ(rank0.Wait(seconds(60)), 0) << ReadAll(dir + "/rank-0.log");
  EXPECT_EQ(rank1.Wait(seconds(60)), 0) << ReadAll(dir + "/rank-1.log");
  EXPECT_EQ(JsonLines(dir + "/out/metrics.jsonl").size(), 1u);
  EXPECT_NE(stranger.Wait(seconds(60)), 0) << ReadAll(dir + "/stranger.log");
  EXPECT_NE(ReadAll(dir + "/stranger.log").find("no answer from the rendezvous server"),
            std::string::npos)
      << ReadAll(dir + "/stranger.log");
}

TEST(DatacenterSecurity, AnUnauthenticatedTcpRendezvousIsRefusedUnlessAskedFor) {
  const std::string dir = MakeTempDir("dc_nokey");
  DcJob job;
  const std::string config = WriteJob(dir, "job", job);
  const Finished rank =
      RunToEnd(Rank(config, dir + "/out", 0, "tcp://127.0.0.1:1"), dir + "/rank.log", seconds(30));
  EXPECT_EQ(rank.exit_code, 2) << rank.log;
  EXPECT_NE(ReadAll(dir + "/rank.log").find("HUDDLE_RENDEZVOUS_KEY"), std::string::npos)
      << ReadAll(dir + "/rank.log");
  // A wildcard bind is refused: rank 0 serves on the address it is given.
  std::vector<std::string> wildcard_argv = Rank(config, dir + "/out", 0, "tcp://*:29999");
  wildcard_argv.insert(wildcard_argv.end(), {"--host", "10.0.0.1"});
  const Finished wildcard =
      RunToEnd(WithEnv({kInsecureRendezvous}, wildcard_argv), dir + "/wildcard.log", seconds(30));
  EXPECT_EQ(wildcard.exit_code, 2) << wildcard.log;
  EXPECT_NE(ReadAll(dir + "/wildcard.log").find("not a wildcard"), std::string::npos)
      << ReadAll(dir + "/wildcard.log");
}

// SIGTERM to the launcher mid-epoch: every rank stops after the same step, rank 0 checkpoints,
// the launcher exits 143 within seconds with its clean-stop message (not a rank failure), and
// --resume finishes the job with the model of an uninterrupted run, byte for byte.
TEST(DatacenterStop, SigtermStopsWithinAStepAndResumeFinishesTheJob) {
  const std::string dir = MakeTempDir("dc_stop");
  DcJob job;
  job.epochs = 30;  // about 75 steps per epoch: a stop lands within an epoch
  const std::string config = WriteJob(dir, "job", job);
  const Finished straight =
      RunToEnd(Launcher(config, dir + "/straight", 2), dir + "/straight.log", seconds(120));
  ASSERT_EQ(straight.exit_code, 0) << straight.log;

  Process launcher(Launcher(config, dir + "/out", 2), dir + "/launcher.log");
  ASSERT_TRUE(WaitFor([&] { return JsonLines(dir + "/out/metrics.jsonl").size() >= 1; },
                      milliseconds(60000)))
      << ReadAll(dir + "/launcher.log");
  launcher.Kill(SIGTERM);
  const auto sent = std::chrono::steady_clock::now();
  const int code = launcher.Wait(seconds(20));
  const double took =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - sent).count();
  const std::string log = ReadAll(dir + "/launcher.log");
  std::printf("the launcher exited %.2f s after SIGTERM\n", took);
  ASSERT_EQ(code, 143) << log;
  EXPECT_LT(took, 5.0) << log;
  EXPECT_NE(log.find("stopped by SIGTERM: every rank stopped cleanly"), std::string::npos) << log;
  EXPECT_EQ(log.find("exited with"), std::string::npos) << log;
  EXPECT_NE(log.find("checkpoint"), std::string::npos) << log;
  ASSERT_FALSE(ReadAll(dir + "/out/checkpoint.bin").empty());
  EXPECT_LT(JsonLines(dir + "/out/metrics.jsonl").size(), 30u) << "the job had finished";

  std::vector<std::string> argv = Launcher(config, dir + "/out", 2);
  argv.push_back("--resume");
  const Finished resumed = RunToEnd(argv, dir + "/resumed.log", seconds(120));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.log;
  EXPECT_EQ(JsonLines(dir + "/out/metrics.jsonl").size(), 30u);
  EXPECT_EQ(ReadAll(dir + "/out/model.bin"), ReadAll(dir + "/straight/model.bin"));
  const auto last = JsonLines(dir + "/out/metrics.jsonl").back();
  EXPECT_EQ(last["train_loss"], JsonLines(dir + "/straight/metrics.jsonl").back()["train_loss"]);
}

// A rank waiting at the rendezvous (its peer never comes, timeout 30 s) honours SIGTERM at once.
TEST(DatacenterStop, ARankWaitingAtTheRendezvousStopsAtOnce) {
  const std::string dir = MakeTempDir("dc_stop_wait");
  DcJob job;
  job.timeout_s = 30;
  const std::string config = WriteJob(dir, "job", job);
  const std::string rendezvous = "tcp://127.0.0.1:" + std::to_string(FreeLoopbackPort());
  Process rank0(WithEnv({kInsecureRendezvous}, Rank(config, dir + "/out", 0, rendezvous)),
                dir + "/rank-0.log");
  std::this_thread::sleep_for(milliseconds(1000));
  rank0.Kill(SIGTERM);
  EXPECT_EQ(rank0.Wait(seconds(3)), 143) << ReadAll(dir + "/rank-0.log");
  EXPECT_NE(ReadAll(dir + "/rank-0.log").find("stopped by SIGTERM before training"),
            std::string::npos)
      << ReadAll(dir + "/rank-0.log");
}

}  // namespace
}  // namespace huddle::testing
