// `huddle run` with `simulation: {clock: virtual}` end to end (transport/sim_transport.h): the same
// job twice gives the same run (metrics but for their `time`, model, record), and its times are
// the simulation's, not the machine's: they follow seconds_per_example.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "tests/integration/job_yaml.h"
#include "tests/integration/process.h"

namespace huddle::testing {
namespace {

using std::chrono::seconds;

constexpr const char* kFashionMnist = "/usr/share/datasets/fashion-mnist";

class VirtualClockTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(std::string(kFashionMnist) + "/train-images-idx3-ubyte.gz")) {
      GTEST_SKIP() << "Fashion-MNIST is not installed (Debian package dataset-fashion-mnist)";
    }
    dir_ = MakeTempDir("virtual_clock");
  }

  // 20 simulated clients (3,000 examples each), 3 rounds of a 10-client cohort, one epoch of the
  // MLP, federated evaluation by 5 clients after each round, on the virtual clock.
  static JobYaml Job(double seconds_per_example) {
    return JobYaml()
        .Set("name", "virtual")
        .Set("seed", 4)
        .Set("rounds", 3)
        .Set("model.hidden", "[32]")
        .Set("train.epochs", 1)
        .Set("train.batch_size", 32)
        .Set("train.learning_rate", 0.1)
        .Set("cohort.size", 10)
        .Set("round.deadline_s", 600)
        .Set("round.quorum", 1)
        .Set("evaluation.mode", "federated")
        .Set("evaluation.every", 1)
        .Set("evaluation.clients", 5)
        .Set("simulation.clients", 20)
        .Set("simulation.threads", 2)
        .Set("simulation.clock", "virtual")
        .Set("simulation.seconds_per_example", seconds_per_example)
        .Set("simulation.latency_s", 0.05)
        .Set("simulation.bandwidth_mbit_s", 100)
        .Set("data.path", kFashionMnist)
        .Set("data.partition", "iid");
  }

  // Runs `job` into DIR/NAME; its metrics rows.
  std::vector<nlohmann::json> Run(const JobYaml& job, const std::string& name) {
    const std::string yaml = job.Write(dir_ + "/" + name + ".yaml");
    const Finished p = RunToEnd({HuddleBin(), "run", yaml, "--out", dir_ + "/" + name},
                                dir_ + "/" + name + ".log", seconds(300));
    EXPECT_EQ(p.exit_code, 0) << p.log;
    EXPECT_NE(p.log.find("on a VIRTUAL clock"), std::string::npos) << p.log;
    std::vector<nlohmann::json> rows;
    for (const std::string& line : ReadLines(dir_ + "/" + name + "/metrics.jsonl")) {
      rows.push_back(nlohmann::json::parse(line));
    }
    return rows;
  }

  std::string dir_;
};

TEST_F(VirtualClockTest, TheSameJobTwiceIsTheSameRun) {
  // Heterogeneous clients that lose some instructions: stragglers, deadlines and dropouts, all
  // decided by the seed.
  JobYaml job = Job(0.001);
  job.Set("simulation.slowdown.distribution", "lognormal")
      .Set("simulation.slowdown.sigma", 1.0)
      .Set("simulation.dropout", 0.2)
      .Set("round.deadline_s", 20);
  std::vector<nlohmann::json> first = Run(job, "a");
  std::vector<nlohmann::json> second = Run(job, "b");
  ASSERT_EQ(first.size(), 3u);
  ASSERT_EQ(second.size(), 3u);
  bool someone_dropped = false;
  for (size_t r = 0; r < first.size(); ++r) {
    EXPECT_TRUE(first[r].contains("time"));
    first[r].erase("time");
    second[r].erase("time");
    EXPECT_EQ(first[r], second[r]) << "round " << r + 1;
    someone_dropped |= first[r]["dropped"].get<int>() > 0;
  }
  EXPECT_TRUE(someone_dropped) << "dropout 0.2 over 30 instructions";
  EXPECT_EQ(ReadAll(dir_ + "/a/model.bin"), ReadAll(dir_ + "/b/model.bin"));
  const std::string record = ReadAll(dir_ + "/a/simulation.json");
  EXPECT_EQ(record, ReadAll(dir_ + "/b/simulation.json"));
  const auto sim = nlohmann::json::parse(record);
  EXPECT_EQ(sim["clock"], "virtual");
  EXPECT_EQ(sim["client_slowdown"].size(), 20u);
  EXPECT_GT(sim["instructions_dropped"].get<int>(), 0);
}

TEST_F(VirtualClockTest, ElapsedTimeIsVirtualAndFollowsSecondsPerExample) {
  // Every client of slowdown 1: a round is its members' 3,000 examples each (3 s at 1 ms an
  // example), plus the links (~0.1 s a message and its answer, 0.1 MB model each way at 100
  // Mbit/s) and the uploads through their slots.
  const std::vector<nlohmann::json> fast = Run(Job(0.001), "fast");
  const std::vector<nlohmann::json> slow = Run(Job(0.004), "slow");
  ASSERT_EQ(fast.size(), 3u);
  ASSERT_EQ(slow.size(), 3u);
  for (size_t r = 0; r < 3; ++r) {
    const double f = fast[r]["duration_s"].get<double>(), s = slow[r]["duration_s"].get<double>();
    EXPECT_GT(f, 3.0) << "round " << r + 1;
    EXPECT_LT(f, 4.0) << "round " << r + 1;
    EXPECT_GT(s, 12.0) << "round " << r + 1;
    EXPECT_LT(s, 13.0) << "round " << r + 1;
  }
  // Three rounds, each followed by an evaluation (1,000 examples' forward passes: 1 s or 4 s).
  const double fast_elapsed = fast.back()["elapsed_s"].get<double>();
  const double slow_elapsed = slow.back()["elapsed_s"].get<double>();
  EXPECT_GT(fast_elapsed, 3 * (3.0 + 1.0));
  EXPECT_LT(fast_elapsed, 3 * (4.0 + 1.5));
  EXPECT_GT(slow_elapsed, 3.5 * fast_elapsed);
  const auto summary = nlohmann::json::parse(ReadAll(dir_ + "/slow/summary.json"));
  EXPECT_DOUBLE_EQ(summary["elapsed_s"].get<double>(), slow_elapsed);
}

// Buffered asynchronous training with secure aggregation (coordinator/secure_session.h): every
// server step is a SecAgg+ session of async.buffer members, concurrency / buffer of them in
// flight at once, some members lost to dropout; each session unmasks with its survivors and is
// applied as the step it was numbered, its staleness one number for all its members.
TEST_F(VirtualClockTest, AsynchronousSecureSessionsInFlightWithDropouts) {
  const JobYaml job = JobYaml()
                          .Set("name", "secagg")
                          .Set("seed", 4)
                          .Set("rounds", 8)
                          .Set("model.hidden", "[32]")
                          .Set("train.epochs", 1)
                          .Set("train.batch_size", 32)
                          .Set("train.learning_rate", 0.1)
                          .Set("async.concurrency", 30)
                          .Set("async.buffer", 10)
                          .Set("async.max_staleness", 4)
                          .Set("round.deadline_s", 30)
                          .Set("aggregation.max_update_norm", 5)
                          .Set("secure_aggregation.enabled", "true")
                          .Set("secure_aggregation.corrupt_fraction", 0.2)
                          .Set("secure_aggregation.min_survivors", 0.7)
                          .Set("evaluation.every", 4)
                          .Set("simulation.clients", 40)
                          .Set("simulation.threads", 2)
                          .Set("simulation.clock", "virtual")
                          .Set("simulation.seconds_per_example", 0.001)
                          .Set("simulation.slowdown.distribution", "lognormal")
                          .Set("simulation.slowdown.sigma", 1.0)
                          .Set("simulation.dropout", 0.05)
                          .Set("data.path", kFashionMnist)
                          .Set("data.partition", "iid");
  const std::vector<nlohmann::json> rows = Run(job, "secagg");
  ASSERT_EQ(rows.size(), 8u);
  bool survivors_only = false;
  double staleness_max = 0;
  for (const nlohmann::json& row : rows) {
    SCOPED_TRACE(row.dump());
    ASSERT_TRUE(row.contains("secure_aggregation"));
    EXPECT_TRUE(row["secure_aggregation"]["released"].get<bool>());
    EXPECT_TRUE(row["updated"].get<bool>());
    EXPECT_LE(row["results"].get<int>(), 10);
    survivors_only |= row["results"].get<int>() < 10;
    // One staleness for the whole session, at most the sessions in flight less one.
    EXPECT_EQ(row["async"]["staleness_mean"], row["async"]["staleness_max"]);
    EXPECT_LE(row["async"]["staleness_max"].get<int>(), 2);
    staleness_max = std::max(staleness_max, row["async"]["staleness_max"].get<double>());
  }
  EXPECT_TRUE(survivors_only) << "dropout 0.05 over 80+ instructions";
  EXPECT_GE(staleness_max, 1);  // sessions overlapped
  EXPECT_GT(rows.back()["test_accuracy"].get<double>(),
            rows[3]["test_accuracy"].get<double>() - 0.05);
  EXPECT_GT(rows.back()["test_accuracy"].get<double>(), 0.5);
  const auto summary = nlohmann::json::parse(ReadAll(dir_ + "/secagg/summary.json"));
  EXPECT_EQ(summary["training"]["mode"], "async");
  EXPECT_EQ(summary["secure_aggregation"]["rounds_released"], 8);
}

// Over-selected sessions (async.over_selection): each is sent 13 clients and its training stage
// ends once 10 have trained; the slowest 3 are dropped from it, and it unmasks the 10.
TEST_F(VirtualClockTest, OverSelectedSessionsTakeTheirFirstMembersToTrain) {
  const JobYaml job = JobYaml()
                          .Set("name", "over")
                          .Set("seed", 4)
                          .Set("rounds", 4)
                          .Set("model.hidden", "[32]")
                          .Set("train.epochs", 1)
                          .Set("train.batch_size", 32)
                          .Set("async.concurrency", 20)
                          .Set("async.buffer", 10)
                          .Set("async.over_selection", 1.3)
                          .Set("round.deadline_s", 600)
                          .Set("aggregation.max_update_norm", 5)
                          .Set("secure_aggregation.enabled", "true")
                          .Set("secure_aggregation.corrupt_fraction", 0.2)
                          .Set("secure_aggregation.min_survivors", 0.6)
                          .Set("evaluation.every", 0)
                          .Set("simulation.clients", 40)
                          .Set("simulation.threads", 2)
                          .Set("simulation.clock", "virtual")
                          .Set("simulation.seconds_per_example", 0.001)
                          .Set("simulation.slowdown.distribution", "lognormal")
                          .Set("simulation.slowdown.sigma", 1.0)
                          .Set("data.path", kFashionMnist)
                          .Set("data.partition", "iid");
  const std::vector<nlohmann::json> rows = Run(job, "over");
  ASSERT_EQ(rows.size(), 4u);
  for (const nlohmann::json& row : rows) {
    SCOPED_TRACE(row.dump());
    EXPECT_EQ(row["clients_sampled"], 13);
    EXPECT_EQ(row["results"], 10);
    EXPECT_EQ(row["dropped"], 3);
    EXPECT_TRUE(row["secure_aggregation"]["released"].get<bool>());
  }
}

}  // namespace
}  // namespace huddle::testing
