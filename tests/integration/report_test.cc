// `huddle report` on real jobs, its pages rendered by headless Chromium (report_check.h): every
// plot of a plain job, of a DP job's public and operator pages and of a datacenter DP job drew
// each of its series; the check fails for a plot whose data were emptied; a running job's page;
// the exit codes; and the service's `report` for an operator, audited.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <thread>

#include "cli/commands.h"
#include "report/format.h"
#include "tests/integration/process.h"
#include "tests/integration/report_check.h"

namespace huddle::testing {
namespace {

using std::chrono::seconds;

constexpr char kFashionMnist[] = "/usr/share/datasets/fashion-mnist";

// A plain simulation's plots and their series: test accuracy; test and training loss; round
// duration and slowest upload; sampled, contributed, dropped, declined, failed, refused; bytes in
// and out.
const ExpectedPlots kFederatedPlots = {
    {"accuracy", 1}, {"loss", 2}, {"duration", 2}, {"participation", 6}, {"traffic", 2}};
// Under DP: no training loss (central DP-FedAvg reports none), epsilon and its steps.
const ExpectedPlots kDpPublicPlots = {
    {"accuracy", 1}, {"loss", 1}, {"epsilon", 1}, {"epsilon_step", 1}};
const ExpectedPlots kDpOperatorPlots = {{"accuracy", 1},      {"loss", 1},    {"duration", 2},
                                        {"participation", 6}, {"traffic", 2}, {"epsilon", 1},
                                        {"epsilon_step", 1}};

std::string SimulationJob(const std::string& name, int rounds, const std::string& extra = "") {
  return "name: " + name + "\nseed: 1\nrounds: " + std::to_string(rounds) +
         "\nsimulation: {clients: 100, threads: 2}\n"
         "model: {kind: mlp, hidden: [32]}\n"
         "train: {epochs: 1, batch_size: 16, learning_rate: 0.05}\n"
         "cohort: {sampling: poisson, rate: 0.2}\n"
         "round: {deadline_s: 60, quorum: 1, upload_slots: 8}\n"
         "evaluation: {every: 1}\n"
         "data: {path: " +
         kFashionMnist + ", partition: iid}\n" + extra;
}

// Central DP with a schedule of two runs of rounds (dp_schedule.yaml, shortened).
std::string DpJob(const std::string& name) {
  return "name: " + name +
         "\nseed: 1\nrounds: 4\nsimulation: {clients: 1000, threads: 2}\n"
         "model: {kind: mlp, hidden: [32]}\n"
         "train: {epochs: 1, batch_size: 16, learning_rate: 0.05, momentum: 0.9}\n"
         "cohort: {sampling: poisson, rate: 0.1}\n"
         "round: {deadline_s: 60, quorum: 1, upload_slots: 8}\n"
         "server: {learning_rate: 1.0, momentum: 0.9}\n"
         "evaluation: {every: 1}\n"
         "data: {path: " +
         std::string(kFashionMnist) +
         ", partition: iid}\n"
         "privacy:\n"
         "  mode: central\n"
         "  expected_cohort_size: 100\n"
         "  epsilon: 8\n"
         "  delta: 1.0e-4\n"
         "  schedule:\n"
         "    - {rounds: [1, 2], noise_multiplier: 1.2, clip_norm: 1.0}\n"
         "    - {rounds: [3, 4], epsilon: 0.5, clip_norm: 0.5}\n";
}

class ReportCommandTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(std::string(kFashionMnist) + "/train-images-idx3-ubyte.gz")) {
      GTEST_SKIP() << "Fashion-MNIST is not installed (Debian package dataset-fashion-mnist)";
    }
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = MakeTempDir(std::string("report_") + info->name());
  }

  bool HasChromium() const { return !ChromiumPath().empty(); }

  // Runs `huddle run` on `yaml` into dir_/NAME; the output directory.
  std::string RunJob(const std::string& name, const std::string& yaml) {
    WriteText(dir_ + "/" + name + ".yaml", yaml);
    const Finished f =
        RunToEnd({HuddleBin(), "run", dir_ + "/" + name + ".yaml", "--out", dir_ + "/" + name},
                 dir_ + "/" + name + ".log", seconds(300));
    EXPECT_EQ(f.exit_code, 0) << f.log;
    return dir_ + "/" + name;
  }
  Finished Report(const std::vector<std::string>& args) {
    std::vector<std::string> argv = {HuddleBin(), "report"};
    argv.insert(argv.end(), args.begin(), args.end());
    const std::string log = dir_ + "/report-" + std::to_string(reports_++) + ".log";
    return RunToEnd(argv, log, seconds(60));
  }
  // The plots of `page` as Chromium drew them; every one in `expected`, in order, drew all of its
  // series.
  void ExpectEveryPlotDrew(const std::string& page, const ExpectedPlots& expected) {
    std::string error;
    const std::vector<PlotDrawn> plots = DrawnPlots(page, dir_, &error);
    ASSERT_FALSE(plots.empty()) << error;
    std::vector<std::string> ids;
    for (const PlotDrawn& p : plots) ids.push_back(p.id);
    std::vector<std::string> expected_ids;
    for (const auto& [id, series] : expected) expected_ids.push_back(id);
    EXPECT_EQ(ids, expected_ids) << page;
    EXPECT_EQ(PlotsNotDrawn(plots, expected), std::vector<std::string>{}) << page;
  }
  // Keeps a screenshot where HUDDLE_REPORT_SCREENSHOTS names a directory (for people to look).
  void Shoot(const std::string& page, const std::string& name, int plots) {
    std::string error;
    const std::string png = dir_ + "/" + name;
    EXPECT_TRUE(Screenshot(page, png, 520 + (plots + 1) / 2 * 376, dir_, &error)) << error;
    if (const char* keep = std::getenv("HUDDLE_REPORT_SCREENSHOTS")) {
      std::filesystem::copy_file(png, std::string(keep) + "/" + name,
                                 std::filesystem::copy_options::overwrite_existing);
    }
  }

  std::string dir_;
  int reports_ = 0;
};

TEST_F(ReportCommandTest, APlainJobsReportDrawsEveryPlot) {
  if (!HasChromium()) GTEST_SKIP() << "chromium is not installed (Debian package chromium)";
  const std::string out = RunJob("plain", SimulationJob("report-plain", 4));
  const Finished f = Report({out});
  ASSERT_EQ(f.exit_code, 0) << f.log;
  EXPECT_EQ(f.log, out + "/report.html\n");
  const std::string html = ReadAll(out + "/report.html");
  EXPECT_NE(html.find("finished: 4 rounds of 4 planned"), std::string::npos);
  ExpectEveryPlotDrew(out + "/report.html", kFederatedPlots);
  Shoot(out + "/report.html", "report_plain.png", 5);
}

TEST_F(ReportCommandTest, TheCheckFailsForAPlotWhoseDataWereEmptied) {
  if (!HasChromium()) GTEST_SKIP() << "chromium is not installed (Debian package chromium)";
  const std::string out = RunJob("plain", SimulationJob("report-emptied", 3));
  // The traffic plot's data taken out of every row.
  std::string rows;
  for (const std::string& line : ReadLines(out + "/metrics.jsonl")) {
    nlohmann::json row = nlohmann::json::parse(line);
    row.erase("bytes_in");
    row.erase("bytes_out");
    rows += row.dump() + "\n";
  }
  WriteText(out + "/metrics.jsonl", rows);
  ASSERT_EQ(Report({out}).exit_code, 0);
  std::string error;
  const std::vector<PlotDrawn> plots = DrawnPlots(out + "/report.html", dir_, &error);
  ASSERT_EQ(plots.size(), kFederatedPlots.size()) << error;
  EXPECT_EQ(PlotsNotDrawn(plots, kFederatedPlots), std::vector<std::string>{"traffic"});
  // One series of a plot emptied is caught too: bytes out only.
  rows.clear();
  for (const std::string& line : ReadLines(out + "/metrics.jsonl")) {
    nlohmann::json row = nlohmann::json::parse(line);
    row["bytes_in"] = 1000;
    rows += row.dump() + "\n";
  }
  WriteText(out + "/metrics.jsonl", rows);
  ASSERT_EQ(Report({out}).exit_code, 0);
  EXPECT_EQ(PlotsNotDrawn(DrawnPlots(out + "/report.html", dir_, &error), kFederatedPlots),
            std::vector<std::string>{"traffic"})
      << error;
}

TEST_F(ReportCommandTest, ADpJobsPublicPageLeavesOutTheOperatorOnlyPlots) {
  if (!HasChromium()) GTEST_SKIP() << "chromium is not installed (Debian package chromium)";
  const std::string out = RunJob("dp", DpJob("report-dp"));
  const Finished pub = Report({out});
  ASSERT_EQ(pub.exit_code, 0) << pub.log;
  EXPECT_NE(pub.log.find("leaves out the operator-only plots (Round duration, Participation, "
                         "Traffic)"),
            std::string::npos)
      << pub.log;
  const Finished op = Report({out, "--operator", "--output", dir_ + "/operator.html"});
  ASSERT_EQ(op.exit_code, 0) << op.log;
  EXPECT_NE(op.log.find("do not publish it"), std::string::npos) << op.log;
  ExpectEveryPlotDrew(out + "/report.html", kDpPublicPlots);
  ExpectEveryPlotDrew(dir_ + "/operator.html", kDpOperatorPlots);
  // The job's own operator-only values: on the operator's page, never on the public one.
  const std::string public_html = ReadAll(out + "/report.html");
  const std::string operator_html = ReadAll(dir_ + "/operator.html");
  const auto first = nlohmann::json::parse(ReadLines(out + "/operator_metrics.jsonl").at(0));
  for (const std::string& value :
       {report::FormatValue(first["bytes_in"].get<double>(), report::ValueFormat::kBytes),
        report::FormatValue(first["bytes_out"].get<double>(), report::ValueFormat::kBytes),
        report::FormatValue(first["duration_s"].get<double>(), report::ValueFormat::kSeconds)}) {
    EXPECT_NE(operator_html.find(value), std::string::npos) << value;
    EXPECT_EQ(public_html.find(value), std::string::npos) << value << " on the public page";
  }
  // The schedule is marked on the privacy plots, with the budget.
  EXPECT_NE(public_html.find("rounds 1\xE2\x80\x93"
                             "2: z 1.2, C 1"),
            std::string::npos);
  EXPECT_NE(public_html.find("budget 8"), std::string::npos);
  Shoot(out + "/report.html", "report_dp.png", 4);
  Shoot(dir_ + "/operator.html", "report_dp_operator.png", 7);
}

TEST_F(ReportCommandTest, ADatacenterDpJobIsReportedPerEpoch) {
  if (!HasChromium()) GTEST_SKIP() << "chromium is not installed (Debian package chromium)";
  const std::string out = dir_ + "/dc";
  WriteText(dir_ + "/dc.yaml",
            "name: report-dc\nseed: 1\nmodel: {kind: mlp, hidden: [32]}\n"
            "train:\n  epochs: 2\n  learning_rate: 0.5\n  momentum: 0.9\n"
            "  dp_sgd: {noise_multiplier: 1.9287, clip_norm: 1.0, expected_batch_size: 2048, "
            "delta: 1.0e-5, epsilon: 3.0}\n"
            "data: {path: " +
                std::string(kFashionMnist) + ", format: idx}\nevaluation: {every: 1, data: " +
                kFashionMnist + "}\ndatacenter: {nproc: 2, device: cpu, timeout_s: 60}\n");
  const Finished job =
      RunToEnd({HuddleBin(), "datacenter", "--config", dir_ + "/dc.yaml", "--out", out},
               dir_ + "/dc.log", seconds(300));
  ASSERT_EQ(job.exit_code, 0) << job.log;
  ASSERT_EQ(Report({out, "--operator"}).exit_code, 0);
  const std::string html = ReadAll(out + "/report.html");
  EXPECT_NE(html.find("finished: 2 epochs"), std::string::npos);
  EXPECT_NE(html.find("datacenter: 2 ranks"), std::string::npos);
  ExpectEveryPlotDrew(out + "/report.html", {{"accuracy", 1},
                                             {"loss", 1},
                                             {"train_accuracy", 1},
                                             {"train_loss", 1},
                                             {"step_time", 1},
                                             {"epsilon", 1},
                                             {"epsilon_step", 1}});
}

TEST_F(ReportCommandTest, ARunningJobCanBeReported) {
  if (!HasChromium()) GTEST_SKIP() << "chromium is not installed (Debian package chromium)";
  WriteText(dir_ + "/long.yaml", SimulationJob("report-running", 100000));
  Process job({HuddleBin(), "run", dir_ + "/long.yaml", "--out", dir_ + "/long"},
              dir_ + "/long.log");
  ASSERT_TRUE(
      WaitFor([&] { return ReadLines(dir_ + "/long/metrics.jsonl").size() >= 3; }, seconds(120)))
      << ReadAll(dir_ + "/long.log");
  // Rendered while rows are appended: a row being written is left out, never an error.
  for (int i = 0; i < 3; ++i) {
    const Finished f = Report({dir_ + "/long", "--output", dir_ + "/running.html"});
    ASSERT_EQ(f.exit_code, 0) << f.log;
  }
  EXPECT_TRUE(job.running()) << "the job ran on while its report was made";
  const std::string html = ReadAll(dir_ + "/running.html");
  EXPECT_NE(html.find("This job is running"), std::string::npos);
  EXPECT_NE(html.find("rounds so far"), std::string::npos);
  ExpectEveryPlotDrew(dir_ + "/running.html", kFederatedPlots);
  job.Kill(SIGTERM);
  job.Wait(seconds(60));
}

TEST_F(ReportCommandTest, ExitCodesFollowTheContract) {
  const std::string out = RunJob("plain", SimulationJob("report-exit", 2));
  EXPECT_EQ(Report({}).exit_code, 2) << "neither OUT nor --job";
  EXPECT_EQ(Report({out, "--job", "x"}).exit_code, 2) << "both";
  EXPECT_EQ(Report({out, "--key", "k.key"}).exit_code, 2) << "operator flags without --job";
  EXPECT_EQ(Report({out, "--bogus"}).exit_code, 2);
  const Finished missing = Report({dir_ + "/nonexistent"});
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_NE(missing.log.find("no such directory"), std::string::npos) << missing.log;
  EXPECT_EQ(Report({out, "--output", dir_ + "/no/such/dir/r.html"}).exit_code, 2);
  EXPECT_EQ(Report({out, "--output", dir_}).exit_code, 2) << "a directory";
  // A damaged line: exit 1, naming the file and the line.
  std::string text = ReadAll(out + "/metrics.jsonl");
  text.insert(text.find('\n') + 1, "{\"round\": 2, oops}\n");
  WriteText(out + "/metrics.jsonl", text);
  const Finished damaged = Report({out});
  EXPECT_EQ(damaged.exit_code, 1);
  EXPECT_NE(damaged.log.find("metrics.jsonl:2: not valid JSON"), std::string::npos) << damaged.log;
  EXPECT_FALSE(std::filesystem::exists(out + "/report.html"));
}

// The service's `report` for an operator: the same pages, from the job's out directory on the
// service's host, with the service's record of its state; audited; an unknown job is exit 2.
TEST_F(ReportCommandTest, TheServiceRendersAJobsReportForAnOperator) {
  const std::string keys = dir_ + "/keys";
  ASSERT_TRUE(cli::GenerateLocalKeys(keys, {"site-0", "site-1", "site-2"}).ok());
  ASSERT_EQ(
      RunToEnd({HuddleBin(), "keygen", "operator", "--id", "alice", "--out", dir_ + "/operators"},
               dir_ + "/keygen.log", seconds(30))
          .exit_code,
      0);
  std::filesystem::create_directories(dir_ + "/operators-allowed");
  std::filesystem::copy_file(dir_ + "/operators/alice.pub", dir_ + "/operators-allowed/alice.pub");
  const std::string agents_at = "tcp://127.0.0.1:" + std::to_string(FreeLoopbackPort());
  const std::string operators_at = "tcp://127.0.0.1:" + std::to_string(FreeLoopbackPort());
  WriteText(dir_ + "/server.yaml",
            "service: {bind: " + agents_at + ", operator_bind: " + operators_at +
                ", state_dir: " + dir_ + "/state, heartbeat_interval_s: 0.2}\n" +
                "http: {bind: \"127.0.0.1:" + std::to_string(FreeLoopbackPort()) + "\"}\n" +
                "security: {server_secret_key: " + keys + "/server.key, allowed_clients: " + keys +
                "/allowed, operators: " + dir_ + "/operators-allowed}\n");
  Process service({HuddleBin(), "serve", "--config", dir_ + "/server.yaml"}, dir_ + "/serve.log");
  std::vector<std::unique_ptr<Process>> agents;
  for (int i = 0; i < 3; ++i) {
    const std::string id = "site-" + std::to_string(i);
    WriteText(dir_ + "/" + id + ".yaml",
              "coordinator: " + agents_at +
                  "\nconnection: {coordinator_timeout_s: 3, backoff_max_s: 0.5}\n"
                  "security: {server_public_key: " +
                  keys + "/server.pub, secret_key: " + keys + "/clients/" + id +
                  ".key}\ndatasets:\n  fmnist: {path: " + kFashionMnist +
                  ", partition: iid, num_shards: 3, shard: " + std::to_string(i) + "}\n");
    agents.push_back(std::make_unique<Process>(
        std::vector<std::string>{HuddleBin(), "agent", "--config", dir_ + "/" + id + ".yaml"},
        dir_ + "/" + id + ".log"));
  }
  const std::vector<std::string> op = {"--service",    operators_at,
                                       "--server-key", keys + "/server.pub",
                                       "--key",        dir_ + "/operators/alice.key"};
  auto with_op = [&](std::vector<std::string> args) {
    args.insert(args.end(), op.begin(), op.end());
    return args;
  };
  WriteText(dir_ + "/svc.yaml",
            "name: svc-dp\nseed: 5\nrounds: 3\nmodel: {kind: mlp, hidden: [16]}\n"
            "train: {epochs: 1, batch_size: 64, learning_rate: 0.05}\n"
            "cohort: {sampling: poisson, rate: 1.0}\n"
            "round: {deadline_s: 60, quorum: 1, upload_slots: 3}\n"
            "evaluation: {every: 1}\n"
            "coordinator: {min_clients: 3, wait_for_clients_s: 60}\n"
            "data: {name: fmnist}\n"
            "privacy: {mode: central, expected_cohort_size: 3, clip_norm: 1.0, epsilon: 50, "
            "delta: 1.0e-4}\n");
  const Finished submit = RunToEnd(with_op({HuddleBin(), "submit", dir_ + "/svc.yaml"}),
                                   dir_ + "/submit.log", seconds(30));
  ASSERT_EQ(submit.exit_code, 0) << submit.log;
  ASSERT_TRUE(WaitFor(
      [&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(450));  // requests are rate-limited
        std::filesystem::remove(dir_ + "/status.log");                // RunToEnd appends
        const Finished f = RunToEnd(with_op({HuddleBin(), "status", "svc-dp", "--json"}),
                                    dir_ + "/status.log", seconds(30));
        const size_t json_at = f.log.find('{');
        if (f.exit_code != 0 || json_at == std::string::npos) return false;
        const auto j = nlohmann::json::parse(f.log.substr(json_at), nullptr, false);
        return !j.is_discarded() && j["job"].value("state", "") == "completed";
      },
      seconds(120)))
      << ReadAll(dir_ + "/serve.log");

  // The default file: NAME-report.html in the current directory.
  std::string command = "cd '" + dir_ + "' && exec '" + HuddleBin() + "' report --job svc-dp";
  for (const std::string& a : op) command += " '" + a + "'";
  const Finished pub = RunToEnd({"/bin/sh", "-c", command}, dir_ + "/report-pub.log", seconds(60));
  ASSERT_EQ(pub.exit_code, 0) << pub.log;
  EXPECT_NE(pub.log.find("svc-dp-report.html\n"), std::string::npos) << pub.log;
  const std::string public_html = ReadAll(dir_ + "/svc-dp-report.html");
  EXPECT_NE(public_html.find("finished: 3 rounds of 3 planned"), std::string::npos);
  EXPECT_EQ(public_html.find("data-plot=\"traffic\""), std::string::npos);
  const Finished with_operator =
      RunToEnd(with_op({HuddleBin(), "report", "--job", "svc-dp", "--operator", "--output",
                        dir_ + "/svc-operator.html"}),
               dir_ + "/report-op.log", seconds(60));
  ASSERT_EQ(with_operator.exit_code, 0) << with_operator.log;
  EXPECT_NE(ReadAll(dir_ + "/svc-operator.html").find("data-plot=\"traffic\""), std::string::npos);
  // Both audited, the operator's view marked.
  std::vector<nlohmann::json> reports;
  for (const std::string& line : ReadLines(dir_ + "/state/audit.jsonl")) {
    nlohmann::json row = nlohmann::json::parse(line);
    if (row["command"] == "report") reports.push_back(row);
  }
  ASSERT_EQ(reports.size(), 2u);
  EXPECT_EQ(reports[0]["operator"], "alice");
  EXPECT_EQ(reports[0]["job"], "svc-dp");
  EXPECT_FALSE(reports[0].contains("operator_view"));
  EXPECT_EQ(reports[1]["operator_view"], true);
  // An unknown job, a name that is none, a client's key: refused, exit 2, nothing written.
  EXPECT_EQ(
      RunToEnd(with_op({HuddleBin(), "report", "--job", "nope", "--output", dir_ + "/nope.html"}),
               dir_ + "/nope.log", seconds(60))
          .exit_code,
      2);
  EXPECT_EQ(
      RunToEnd(with_op({HuddleBin(), "report", "--job", "../x", "--output", dir_ + "/x.html"}),
               dir_ + "/x.log", seconds(60))
          .exit_code,
      2);
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/nope.html"));
  if (HasChromium()) {
    ExpectEveryPlotDrew(dir_ + "/svc-dp-report.html", kDpPublicPlots);
    ExpectEveryPlotDrew(dir_ + "/svc-operator.html", kDpOperatorPlots);
  }
  service.Kill(SIGTERM);
  EXPECT_EQ(service.Wait(seconds(30)), 128 + SIGTERM);
}

}  // namespace
}  // namespace huddle::testing
