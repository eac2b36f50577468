// One rank of the `huddle datacenter` job in this process (datacenter/job.h): a tiny MLP on a
// synthetic CSV training set, through a file:// rendezvous. The job trains to its end and writes
// its outputs; a stop ends it with a checkpoint; a DP-SGD job refuses a fresh start over its
// ledger; a --resume of a finished job changes nothing.
#include "datacenter/job.h"

#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "absl/strings/str_split.h"
#include "common/clock.h"
#include "common/file_util.h"
#include "common/time_format.h"
#include "datacenter/checkpoint.h"
#include "privacy/report.h"
#include "tests/testing/temp_dir.h"

namespace huddle::datacenter {
namespace {

constexpr int64_t kRows = 64;
constexpr int64_t kFeatures = 4;

std::string ReadText(const std::string& path) {
  auto text = ReadFile(path);
  return text.ok() ? *text : "";
}

class DatacenterJobTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // Two classes: the label is whether the first feature is positive.
    std::string csv;
    for (int64_t i = 0; i < kRows; ++i) {
      const double f0 = static_cast<double>(i % 7) - 3.0 + 0.25;
      csv += fmt::format("{},{},{},{},{}\n", f0 > 0 ? 1 : 0, f0, 0.1 * static_cast<double>(i % 5),
                         -0.2 * static_cast<double>(i % 3), 0.5);
    }
    ASSERT_TRUE(WriteFileAtomic(dir_ / "train.csv", csv).ok());
  }

  // A job in OUT = DIR/<out> without evaluation: 2 epochs of 8-row batches (16 steps).
  DatacenterConfig Config(const std::string& out) const {
    DatacenterConfig c;
    c.job_name = "job-test";
    c.seed = 7;
    c.model = models::MlpSpec{kFeatures, {8}, 2};
    c.train.epochs = 2;
    c.train.batch_size = 8;
    c.train.learning_rate = 0.1;
    c.data.path = dir_ / "train.csv";
    c.data.format = "csv";
    c.data.num_classes = 2;
    c.eval_data = "";
    c.timeout_ms = 30000;
    c.out_dir = dir_ / out;
    return c;
  }

  // `c` with DP-SGD across the ranks: expected batch 16 of 64, noise multiplier 1.
  static DatacenterConfig WithDpSgd(DatacenterConfig c) {
    DatacenterDpSgd dp;
    dp.dp.noise_multiplier = 1.0;
    dp.dp.clip_norm = 1.0;
    dp.dp.expected_batch_size = 16;
    c.dp_sgd = dp;
    return c;
  }

  // Rank 0 of a one-rank job, joined through a fresh file:// store.
  RankOptions OneRank(const std::atomic<bool>* stop = nullptr) {
    RankOptions o;
    o.collective.rank = 0;
    o.collective.world_size = 1;
    o.collective.timeout = std::chrono::milliseconds(30000);
    o.rendezvous = "file://" + dirs_.Make("rendezvous");
    o.run_id = "job-test";
    o.stop = stop;
    return o;
  }

  testing::ScopedTempDir dir_{"dc_job"};
  testing::TempDirs dirs_;
};

TEST_F(DatacenterJobTest, OneRankTrainsToItsEndAndWritesItsOutputs) {
  const DatacenterConfig c = Config("out");
  bool started = false;
  RankOptions o = OneRank();
  o.on_training_start = [&started] { started = true; };
  ASSERT_TRUE(RunRank(c, o).ok());
  EXPECT_TRUE(started);
  for (const char* file : {"model.bin", "checkpoint.bin", "summary.json", "metrics.jsonl"}) {
    EXPECT_TRUE(std::filesystem::exists(OutPath(c.out_dir, file))) << file;
  }
  EXPECT_FALSE(std::filesystem::exists(OutPath(c.out_dir, privacy::kLedgerFile)));
  const auto summary = nlohmann::json::parse(ReadText(OutPath(c.out_dir, "summary.json")));
  EXPECT_EQ(summary["steps"].get<int64_t>(), 2 * kRows / 8);
  EXPECT_EQ(summary["world_size"].get<int>(), 1);
  EXPECT_EQ(summary["global_batch"].get<int64_t>(), 8);
  auto state = ReadTrainingState(OutPath(c.out_dir, kDatacenterCheckpointFile));
  ASSERT_TRUE(state.ok()) << state.status();
  EXPECT_EQ(state->epochs_done, 2);
  EXPECT_EQ(state->steps, 2 * kRows / 8);

  // The same job again trains the same model, bit for bit.
  const DatacenterConfig again = Config("again");
  ASSERT_TRUE(RunRank(again, OneRank()).ok());
  const std::string model = ReadText(OutPath(c.out_dir, "model.bin"));
  EXPECT_FALSE(model.empty());
  EXPECT_EQ(model, ReadText(OutPath(again.out_dir, "model.bin")));
}

// Each metrics row says when it was written (ISO-8601 UTC); with DP-SGD only the operator's rows
// do (their times give the epochs' durations), and every ledger line has its release's time.
TEST_F(DatacenterJobTest, RowsHaveTheWallTimeTheyWereWritten) {
  auto rows = [](const std::string& path) {
    std::vector<nlohmann::json> out;
    const std::string text = ReadText(path);
    for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
      out.push_back(nlohmann::json::parse(std::string(line)));
    }
    return out;
  };
  const int64_t from_ms = SteadyClock::Get()->WallMs();
  auto expect_time = [&](const nlohmann::json& row) {
    ASSERT_TRUE(row.contains("time") && row["time"].is_string()) << row;
    auto at = ParseIso8601Utc(row["time"].get<std::string>());
    ASSERT_TRUE(at.ok()) << at.status();
    EXPECT_GE(*at, from_ms) << row;
    EXPECT_LE(*at, SteadyClock::Get()->WallMs()) << row;
  };
  const DatacenterConfig plain = Config("plain");
  ASSERT_TRUE(RunRank(plain, OneRank()).ok());
  const std::vector<nlohmann::json> metrics = rows(OutPath(plain.out_dir, "metrics.jsonl"));
  ASSERT_EQ(metrics.size(), 2u);
  for (const nlohmann::json& row : metrics) expect_time(row);

  const DatacenterConfig dp = WithDpSgd(Config("dp"));
  ASSERT_TRUE(RunRank(dp, OneRank()).ok());
  const std::vector<nlohmann::json> pub = rows(OutPath(dp.out_dir, "metrics.jsonl"));
  ASSERT_EQ(pub.size(), 2u);
  for (const nlohmann::json& row : pub) EXPECT_FALSE(row.contains("time")) << row;
  const std::vector<nlohmann::json> ops = rows(OutPath(dp.out_dir, privacy::kOperatorMetricsFile));
  ASSERT_EQ(ops.size(), 2u);
  for (const nlohmann::json& row : ops) expect_time(row);
  const std::vector<nlohmann::json> ledger = rows(OutPath(dp.out_dir, privacy::kLedgerFile));
  ASSERT_EQ(ledger.size(), 2u);
  for (const nlohmann::json& row : ledger) expect_time(row);
}

TEST_F(DatacenterJobTest, AResumeOfAFinishedJobChangesNothing) {
  const DatacenterConfig c = Config("out");
  ASSERT_TRUE(RunRank(c, OneRank()).ok());
  const std::string metrics = ReadText(OutPath(c.out_dir, "metrics.jsonl"));
  const std::string summary = ReadText(OutPath(c.out_dir, "summary.json"));
  auto finished = ResumesAFinishedJob(c);
  ASSERT_TRUE(finished.ok()) << finished.status();
  EXPECT_TRUE(*finished);
  RankOptions o = OneRank();
  o.resume = true;
  ASSERT_TRUE(RunRank(c, o).ok());
  EXPECT_EQ(ReadText(OutPath(c.out_dir, "metrics.jsonl")), metrics);
  EXPECT_EQ(ReadText(OutPath(c.out_dir, "summary.json")), summary);
}

TEST_F(DatacenterJobTest, AStopEndsTrainingWithACheckpointToResumeFrom) {
  const DatacenterConfig c = Config("out");
  const std::atomic<bool> stop{true};
  const Status st = RunRank(c, OneRank(&stop));
  ASSERT_FALSE(st.ok());
  EXPECT_TRUE(IsStop(st)) << st;
  EXPECT_FALSE(IsRefusal(st));
  EXPECT_TRUE(absl::IsCancelled(st)) << st;
  EXPECT_TRUE(std::string(st.message()).starts_with("rank 0: ")) << st;
  auto state = ReadTrainingState(OutPath(c.out_dir, kDatacenterCheckpointFile));
  ASSERT_TRUE(state.ok()) << state.status();
  EXPECT_LT(state->steps, 2 * kRows / 8);
  EXPECT_FALSE(std::filesystem::exists(OutPath(c.out_dir, "model.bin")));
}

TEST_F(DatacenterJobTest, ADpSgdJobRefusesAFreshStartOverItsLedger) {
  const DatacenterConfig c = WithDpSgd(Config("out"));
  ASSERT_TRUE(RunRank(c, OneRank()).ok());
  const std::string ledger = ReadText(OutPath(c.out_dir, privacy::kLedgerFile));
  ASSERT_FALSE(ledger.empty());
  EXPECT_TRUE(std::filesystem::exists(OutPath(c.out_dir, privacy::kPrivacyReportFile)));

  const Status st = RunRank(c, OneRank());
  EXPECT_TRUE(absl::IsFailedPrecondition(st)) << st;
  EXPECT_TRUE(std::string(st.message()).starts_with("privacy ledger: ")) << st;
  EXPECT_FALSE(IsRefusal(st));  // the command's exit code 1
  EXPECT_FALSE(IsStop(st));
  EXPECT_EQ(ReadText(OutPath(c.out_dir, privacy::kLedgerFile)), ledger);
}

TEST_F(DatacenterJobTest, AJobWithoutDpSgdRefusesAnOutputDirectoryWithALedger) {
  const DatacenterConfig dp = WithDpSgd(Config("out"));
  ASSERT_TRUE(RunRank(dp, OneRank()).ok());
  const Status st = RunRank(Config("out"), OneRank());
  EXPECT_TRUE(absl::IsFailedPrecondition(st)) << st;
  EXPECT_FALSE(IsRefusal(st));
}

TEST_F(DatacenterJobTest, ADpSgdPlanOverItsBudgetIsARefusal) {
  DatacenterConfig c = WithDpSgd(Config("out"));
  c.dp_sgd->epsilon_budget = 1e-3;
  const Status st = RunRank(c, OneRank());
  EXPECT_TRUE(absl::IsFailedPrecondition(st)) << st;
  EXPECT_TRUE(IsRefusal(st));  // the command's exit code 2
  EXPECT_FALSE(std::filesystem::exists(OutPath(c.out_dir, privacy::kLedgerFile)));
}

TEST_F(DatacenterJobTest, MissingTrainingDataIsNamed) {
  DatacenterConfig c = Config("out");
  c.data.path = dir_ / "missing.csv";
  const Status st = RunRank(c, OneRank());
  EXPECT_FALSE(st.ok());
  EXPECT_TRUE(std::string(st.message()).starts_with("training data: ")) << st;
  EXPECT_FALSE(IsRefusal(st));
}

}  // namespace
}  // namespace huddle::datacenter
