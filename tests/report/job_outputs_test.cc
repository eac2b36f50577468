// Reading a job's files for the report: rows as they stand while a job writes them, the errors
// that name a damaged file's line, participation as counts, model.bin's headers.
#include "report/job_outputs.h"

#include <gtest/gtest.h>

#include "common/tensor_io.h"
#include "tests/report/fixture.h"

namespace huddle::report {
namespace {

using testing::JobDir;
using testing::json;

constexpr uint64_t kLimit = 1 << 20;

TEST(JobOutputsTest, ALastLineWithoutItsNewlineIsLeftOut) {
  JobDir d;
  d.AppendRow("metrics.jsonl", {{"round", 1}, {"test_accuracy", 0.5}});
  d.Append("metrics.jsonl", "\n");  // a blank line is no row
  d.AppendRow("metrics.jsonl", {{"round", 2}, {"test_accuracy", 0.6}});
  d.Append("metrics.jsonl", "{\"round\": 3, \"test_accuracy\": 0.7}");  // complete, but no newline
  StatusOr<RowsFile> rows = ReadRows(d / "metrics.jsonl", "round", kLimit);
  ASSERT_TRUE(rows.ok()) << rows.status();
  EXPECT_TRUE(rows->present);
  EXPECT_TRUE(rows->partial_last_line);
  ASSERT_EQ(rows->rows.size(), 2u);
  EXPECT_EQ(rows->rows[1].x, 2);
  EXPECT_EQ(rows->rows[1].Get("test_accuracy"), 0.6);
}

TEST(JobOutputsTest, RowsAreFlattenedOneLevel) {
  JobDir d;
  d.AppendRow("m.jsonl", {{"round", 1},
                          {"updated", true},
                          {"train_loss", nullptr},
                          {"upload_s", {{"max", 0.07}, {"p50", nullptr}}},
                          {"privacy", {{"mode", "central"}, {"deep", {{"x", 1}}}}},
                          {"upload_seconds", {0.1, 0.2}}});
  StatusOr<RowsFile> rows = ReadRows(d / "m.jsonl", "round", kLimit);
  ASSERT_TRUE(rows.ok()) << rows.status();
  const Row& r = rows->rows.at(0);
  EXPECT_EQ(r.Get("updated"), 1);
  EXPECT_EQ(r.Get("train_loss"), std::nullopt);
  EXPECT_EQ(r.Get("upload_s.max"), 0.07);
  EXPECT_EQ(r.Get("upload_s.p50"), std::nullopt);
  EXPECT_EQ(r.strings.at("privacy.mode"), "central");
  EXPECT_EQ(r.numbers.count("privacy.deep"), 0u);
  EXPECT_EQ(r.numbers.count("upload_seconds"), 0u);
}

TEST(JobOutputsTest, EveryDamagedLineNamesTheFileAndTheLine) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"{\"round\": 1}\n{\"round\": 2,}\n", ":2: not valid JSON"},
      {"{\"round\": 1}\n\"text\"\n", ":2: not a JSON object"},
      {"{\"test_accuracy\": 0.5}\n", ":1: the row has no \"round\""},
      {"{\"round\": -1}\n", ":1: the row has no \"round\""},
      {"{\"round\": \"one\"}\n", ":1: the row has no \"round\""},
  };
  for (const auto& [text, error] : cases) {
    JobDir d;
    d.Write("metrics.jsonl", text);
    StatusOr<RowsFile> rows = ReadRows(d / "metrics.jsonl", "round", kLimit);
    ASSERT_FALSE(rows.ok()) << text;
    EXPECT_TRUE(absl::IsDataLoss(rows.status())) << rows.status();
    EXPECT_NE(rows.status().message().find("metrics.jsonl" + error), std::string::npos)
        << rows.status();
  }
}

TEST(JobOutputsTest, AFileOverItsLimitIsRefusedNotRead) {
  JobDir d;
  d.Write("metrics.jsonl", std::string(2000, ' '));
  StatusOr<RowsFile> rows = ReadRows(d / "metrics.jsonl", "round", 1000);
  ASSERT_FALSE(rows.ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(rows.status())) << rows.status();
}

TEST(JobOutputsTest, ParticipationBecomesCountsWithoutIds) {
  JobDir d;
  d.AppendRow("participation.jsonl", {{"round", 1},
                                      {"sampled", {"a", "b", "c", "d", "e"}},
                                      {"contributed", {"a"}},
                                      {"left",
                                       {{"b", {{"outcome", "dropped"}, {"why", "silent"}}},
                                        {"c", {{"outcome", "refused"}, {"why", "norm"}}},
                                        {"d", {{"outcome", "declined"}}},
                                        {"e", {{"outcome", 7}}}}}});
  StatusOr<RowsFile> rows = ReadRows(d / "participation.jsonl", "round", kLimit, true);
  ASSERT_TRUE(rows.ok()) << rows.status();
  const Row& r = rows->rows.at(0);
  EXPECT_EQ(r.Get("sampled"), 5);
  EXPECT_EQ(r.Get("contributed"), 1);
  EXPECT_EQ(r.Get("dropped"), 2) << "an outcome of another type counts as dropped";
  EXPECT_EQ(r.Get("refused"), 1);
  EXPECT_EQ(r.Get("declined"), 1);
  EXPECT_EQ(r.Get("failed"), 0);
  EXPECT_TRUE(r.strings.empty());
}

TEST(JobOutputsTest, DpAndDatacenterAreToldFromTheFiles) {
  JobDir plain;
  plain.AppendRow("metrics.jsonl", JobDir::PlainRound(1));
  StatusOr<JobOutputs> o = ReadJobOutputs(plain.path(), false);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_FALSE(o->dp);
  EXPECT_FALSE(o->datacenter);
  EXPECT_TRUE(o->operator_files_read);
  EXPECT_EQ(o->operator_metrics.rows.size(), 1u) << "without DP the metrics are the operator's";

  JobDir dp;
  dp.AppendRow("metrics.jsonl", {{"round", 1}, {"epsilon", 1.0}});
  o = ReadJobOutputs(dp.path(), false);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_TRUE(o->dp);
  EXPECT_FALSE(o->operator_files_read);

  JobDir only_operator_file;  // a DP job before its first public row
  only_operator_file.AppendRow("operator_metrics.jsonl", {{"round", 1}});
  o = ReadJobOutputs(only_operator_file.path(), false);
  ASSERT_TRUE(o.ok());
  EXPECT_TRUE(o->dp);

  JobDir dc;
  dc.AppendRow("metrics.jsonl", {{"epoch", 1}, {"test_accuracy", 0.8}});
  o = ReadJobOutputs(dc.path(), false);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_TRUE(o->datacenter);
  EXPECT_FALSE(o->dp);
}

TEST(JobOutputsTest, TheServicesRecordAndModelAreReadBesideOut) {
  JobDir state;
  const std::string job = state / "jobs/alpha";
  std::filesystem::create_directories(job + "/out");
  state.Write("jobs/alpha/state.json", json{{"name", "alpha"}, {"state", "stopped"}}.dump());
  state.Write("jobs/alpha/job.yaml",
              "name: alpha\nmodel: {kind: mlp, hidden: [16]}\nsecurity_never_shown: 1\n");
  ASSERT_TRUE(WriteModelFile(job + "/out/model.bin",
                             {Tensor("fc0.weight", {16, 784}), Tensor("fc0.bias", {16})})
                  .ok());
  StatusOr<JobOutputs> o = ReadJobOutputs(job + "/out/", false);
  ASSERT_TRUE(o.ok()) << o.status();
  ASSERT_TRUE(o->record.has_value());
  EXPECT_EQ((*o->record)["state"], "stopped");
  EXPECT_EQ(o->model_config, "{kind: mlp, hidden: [16]}");
  ASSERT_TRUE(o->model.has_value());
  EXPECT_EQ(o->model->tensors, 2);
  EXPECT_EQ(o->model->parameters, 16 * 784 + 16);
}

TEST(JobOutputsTest, ADamagedModelFileIsAnError) {
  JobDir d;
  d.Write("model.bin", std::string("HUDDLEM1") + std::string("\x01\x00\x00\x00", 4) +
                           std::string("\x02\x00\x00\x00", 4) + "ab" +
                           std::string("\x01\x00\x00\x00", 4) +
                           std::string("\x00\x00\x00\x00\x00\x00\x10\x00", 8));
  StatusOr<std::optional<ModelFileInfo>> m = ReadModelHeader(d / "model.bin");
  ASSERT_FALSE(m.ok());
  EXPECT_TRUE(absl::IsDataLoss(m.status())) << m.status();
  d.Write("model.bin", "not a model");
  EXPECT_FALSE(ReadModelHeader(d / "model.bin").ok());
  EXPECT_FALSE(ReadModelHeader(d / "missing.bin")->has_value());
}

}  // namespace
}  // namespace huddle::report
