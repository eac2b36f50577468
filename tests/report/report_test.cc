// The report page from fixture output directories: every plot of a plain job, the DP rule (no
// operator-only value on the public page, each one labelled on the operator's), a running job,
// missing and damaged files, hostile text, no external reference, datacenter epochs.
#include "report/report.h"

#include <gtest/gtest.h>

#include "report/format.h"
#include "tests/report/fixture.h"

namespace huddle::report {
namespace {

using testing::JobDir;
using testing::json;

// Distinctive operator-only values of the DP fixture, and how the operator's page writes them.
constexpr double kSecretDuration = 7.654321;
constexpr double kSecretBytesIn = 987654321;
constexpr double kSecretSampled = 4321;
constexpr double kSecretElapsed = 5432.1;
constexpr double kSecretTotalBytes = 3141592653;
constexpr char kSecretClient[] = "client-zebra-7";

std::vector<std::string> SecretStrings() {
  return {FormatValue(kSecretDuration, ValueFormat::kSeconds),
          FormatValue(kSecretBytesIn, ValueFormat::kBytes),
          FormatValue(kSecretSampled, ValueFormat::kInteger),
          FormatValue(kSecretElapsed, ValueFormat::kSeconds),
          FormatValue(kSecretTotalBytes, ValueFormat::kBytes)};
}

// A central-DP job of 4 planned rounds (a schedule of two runs), `rounds` of them run.
void WriteDpJob(JobDir& d, int rounds, bool finished) {
  for (int r = 1; r <= rounds; ++r) {
    const bool first_run = r <= 2;
    d.AppendRow("metrics.jsonl", {{"round", r},
                                  {"updated", true},
                                  {"test_accuracy", 0.5 + 0.02 * r},
                                  {"test_loss", 1.5 - 0.05 * r},
                                  {"epsilon", 1.0 + 0.1 * r},
                                  {"delta", 1e-4},
                                  {"privacy",
                                   {{"mode", "central"},
                                    {"private", true},
                                    {"accountant", "rdp"},
                                    {"budget_epsilon", 8.0},
                                    {"noise_multiplier", first_run ? 1.2 : 1.78},
                                    {"clip_norm", first_run ? 1.0 : 0.5},
                                    {"noise_stddev", 1.2},
                                    {"next_clip_norm", nullptr}}}});
    d.AppendRow("operator_metrics.jsonl", {{"round", r},
                                           {"time", "2026-11-29T05:44:45.708Z"},
                                           {"clients_sampled", kSecretSampled},
                                           {"results", 4000},
                                           {"dropped", 321},
                                           {"train_loss", nullptr},
                                           {"duration_s", kSecretDuration},
                                           {"upload_s", {{"count", 2}, {"max", 1.5}}},
                                           {"bytes_in", kSecretBytesIn},
                                           {"bytes_out", 123456789}});
    d.AppendRow("participation.jsonl",
                {{"round", r},
                 {"sampled", {kSecretClient, "client-2"}},
                 {"contributed", {kSecretClient}},
                 {"left", {{"client-2", {{"outcome", "declined"}, {"why", "its policy"}}}}}});
  }
  d.WriteJson("privacy.json",
              {{"job", "dp-job"},
               {"scope", "federated"},
               {"private", true},
               {"epsilon", 1.0 + 0.1 * rounds},
               {"delta", 1e-4},
               {"budget_epsilon", 8.0},
               {"rounds", {{"planned", 4}, {"run", rounds}}},
               {"planned_epsilon", 1.4},
               {"noise_schedule",
                {{{"rounds", {1, 2}}, {"noise_multiplier", 1.2}, {"clip_norm", 1.0}},
                 {{"rounds", {3, 4}}, {"noise_multiplier", 1.78}, {"clip_norm", 0.5}}}},
               {"unit_of_privacy", "client"},
               {"accountant", "rdp"}});
  if (finished) {
    d.WriteJson("summary.json", {{"job", "dp-job"},
                                 {"rounds", 4},
                                 {"rounds_completed", rounds},
                                 {"final_test_accuracy", 0.58},
                                 {"best_test_accuracy", 0.58},
                                 {"best_round", rounds},
                                 {"privacy", {{"mode", "central"}, {"epsilon", 1.4}}},
                                 {"operator",
                                  {{"note", "operator-only: not DP-protected"},
                                   {"elapsed_s", kSecretElapsed},
                                   {"bytes_in", kSecretTotalBytes},
                                   {"bytes_out", 1}}}});
  }
}

void WritePlainJob(JobDir& d, int rounds) {
  for (int r = 1; r <= rounds; ++r) d.AppendRow("metrics.jsonl", JobDir::PlainRound(r));
  d.WriteJson("summary.json", {{"job", "plain-job"},
                               {"rounds", rounds},
                               {"rounds_completed", rounds},
                               {"final_test_accuracy", 0.7},
                               {"elapsed_s", 12.5},
                               {"bytes_in", 1 << 30},
                               {"bytes_out", 1 << 30}});
}

Report Render(const std::string& dir, bool operator_view = false, ReportOptions options = {}) {
  options.operator_view = operator_view;
  options.build = "0.1.0 (git test)";
  options.generated_at = "2026-11-29T06:00:00.000Z";
  StatusOr<Report> report = RenderReport(dir, options);
  EXPECT_TRUE(report.ok()) << report.status();
  return report.ok() ? *std::move(report) : Report{};
}

// The markup of the figure of plot `id` ("" when the page has none).
std::string Figure(const std::string& html, const std::string& id) {
  const size_t at = html.find("data-plot=\"" + id + "\"");
  if (at == std::string::npos) return "";
  const size_t start = html.rfind("<figure", at);
  return html.substr(start, html.find("</figure>", at) - start);
}

std::string ReadAllForTest(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

size_t Count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// No reference to anything outside the page. `urls_in_text`: a hostile fixture's text names
// URLs (escaped, inert); the page's own markup never does.
void ExpectSelfContained(const std::string& html, bool urls_in_text = false) {
  for (const char* bad : {"src=", "href=", "@import", "url(", "<script", "<link", "<img", "<iframe",
                          "<object", "<embed", "<use", "xlink"}) {
    EXPECT_EQ(html.find(bad), std::string::npos) << "the page holds '" << bad << "'";
  }
  if (!urls_in_text) {
    for (const char* bad : {"http:", "https:", "file:", "//"}) {
      EXPECT_EQ(html.find(bad), std::string::npos) << "the page holds '" << bad << "'";
    }
  }
  EXPECT_NE(html.find("Content-Security-Policy\" content=\"default-src 'none'"), std::string::npos);
}

TEST(ReportTest, APlainJobHasEveryPlotWithItsData) {
  JobDir d;
  WritePlainJob(d, 5);
  const Report r = Render(d.path());
  EXPECT_FALSE(r.dp);
  EXPECT_FALSE(r.holds_operator_only);
  EXPECT_TRUE(r.left_out.empty());
  EXPECT_EQ(r.state, "finished: 5 rounds of 5 planned");
  for (const char* id : {"accuracy", "loss", "duration", "participation", "traffic"}) {
    const std::string figure = Figure(r.html, id);
    ASSERT_FALSE(figure.empty()) << id;
    EXPECT_EQ(figure.find("plot-svg empty"), std::string::npos) << id;
    EXPECT_EQ(figure.find("operator-only"), std::string::npos) << id << ": no DP, no label";
    EXPECT_GE(Count(figure, "<circle class=\"marker\""), 5u) << id << ": a marker per round";
  }
  EXPECT_EQ(Figure(r.html, "epsilon"), "") << "no DP, no privacy plot";
  // Participation: the six counts; traffic in binary units.
  EXPECT_EQ(Count(Figure(r.html, "participation"), "<g class=\"series\""), 6u);
  EXPECT_NE(Figure(r.html, "traffic").find(FormatValue(19549104, ValueFormat::kBytes)),
            std::string::npos);
  EXPECT_NE(r.html.find("12.5 s of wall time; 1 GiB in, 1 GiB out"), std::string::npos);
  EXPECT_NE(r.html.find(EscapeText("huddle 0.1.0 (git test)")), std::string::npos);
  EXPECT_NE(r.html.find("2026-11-29T06:00:00.000Z"), std::string::npos);
  ExpectSelfContained(r.html);
}

TEST(ReportTest, UnderDpThePublicPageHoldsNoOperatorOnlyValue) {
  JobDir d;
  WriteDpJob(d, 4, /*finished=*/true);
  const Report pub = Render(d.path());
  const Report op = Render(d.path(), /*operator_view=*/true);
  EXPECT_TRUE(pub.dp);
  // The operator's page shows every distinctive value (so the public page would, if it drew
  // them)...
  for (const std::string& secret : SecretStrings()) {
    EXPECT_NE(op.html.find(secret), std::string::npos) << secret;
    EXPECT_EQ(pub.html.find(secret), std::string::npos) << secret << " on the public page";
  }
  // ...and neither names a client of the cohort.
  EXPECT_EQ(op.html.find(kSecretClient), std::string::npos);
  EXPECT_EQ(pub.html.find(kSecretClient), std::string::npos);
  // The public page: the plots left out, named with the reason; no plot marked operator-only.
  EXPECT_FALSE(pub.holds_operator_only);
  EXPECT_EQ(pub.left_out, (std::vector<std::string>{"Round duration", "Participation", "Traffic"}));
  EXPECT_NE(pub.html.find("Left out of this page"), std::string::npos);
  EXPECT_NE(pub.html.find("Round duration: operator-only under DP"), std::string::npos);
  for (const char* id : {"duration", "participation", "traffic"}) {
    EXPECT_EQ(Figure(pub.html, id), "") << id;
  }
  EXPECT_EQ(pub.html.find("class=\"plot operator-only\""), std::string::npos);
  EXPECT_EQ(pub.html.find("class=\"banner\""), std::string::npos);
  // The operator's page: each operator-only plot and value labelled; the public plots not.
  EXPECT_TRUE(op.holds_operator_only);
  EXPECT_NE(op.html.find("class=\"banner\""), std::string::npos);
  for (const char* id : {"duration", "participation", "traffic"}) {
    const std::string figure = Figure(op.html, id);
    EXPECT_NE(figure.find("<figure class=\"plot operator-only\""), std::string::npos) << id;
    EXPECT_NE(figure.find(kOperatorOnlyLabel), std::string::npos) << id;
  }
  for (const char* id : {"accuracy", "loss", "epsilon", "epsilon_step"}) {
    EXPECT_EQ(Figure(op.html, id).find(kOperatorOnlyLabel), std::string::npos) << id;
  }
  EXPECT_NE(op.html.find("<tr class=\"operator-only\"><th>Totals</th><td>" +
                         EscapeText(kOperatorOnlyLabel) + ": "),
            std::string::npos);
  ExpectSelfContained(pub.html);
  ExpectSelfContained(op.html);
}

TEST(ReportTest, ThePrivacyPlotsMarkTheBudgetThePlanAndTheSchedule) {
  JobDir d;
  WriteDpJob(d, 4, /*finished=*/true);
  const Report r = Render(d.path());
  const std::string eps = Figure(r.html, "epsilon");
  EXPECT_NE(eps.find("budget 8"), std::string::npos);
  EXPECT_NE(eps.find("planned 1.4"), std::string::npos);
  EXPECT_NE(eps.find("rounds 1\xE2\x80\x93"
                     "2: z 1.2, C 1"),
            std::string::npos)
      << eps;
  EXPECT_EQ(Count(eps, "<rect class=\"band\""), 2u);
  EXPECT_EQ(Count(eps, "<circle class=\"marker\""), 4u);
  const std::string step = Figure(r.html, "epsilon_step");
  EXPECT_EQ(Count(step, "<rect class=\"band\""), 2u);
  EXPECT_NE(step.find("epsilon of the round, round 2: 0.1<"), std::string::npos) << step;
  EXPECT_NE(r.html.find("budget epsilon 8; spent 1.4"), std::string::npos);
}

TEST(ReportTest, OperatorOnlyFilesAreNotEvenReadForThePublicPage) {
  JobDir d;
  WriteDpJob(d, 2, /*finished=*/true);
  d.Append("operator_metrics.jsonl", "{\"round\": 3, torn\n{\"round\": 4}\n");
  EXPECT_TRUE(RenderReport(d.path(), {}).ok());
  ReportOptions op;
  op.operator_view = true;
  StatusOr<Report> r = RenderReport(d.path(), op);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(absl::IsDataLoss(r.status())) << r.status();
  EXPECT_NE(r.status().message().find("operator_metrics.jsonl:3: not valid JSON"),
            std::string::npos)
      << r.status();
}

TEST(ReportTest, ARunningJobLeavesOutTheRowBeingWrittenAndSaysItRuns) {
  JobDir d;
  WriteDpJob(d, 3, /*finished=*/false);
  d.Append("metrics.jsonl", "{\"round\": 4, \"test_accuracy\": 0.");
  const Report r = Render(d.path(), /*operator_view=*/true);
  EXPECT_EQ(r.state, "running: 3 rounds of 4 planned so far");
  EXPECT_NE(r.html.find("This job is running"), std::string::npos);
  EXPECT_NE(r.html.find("the last line of metrics.jsonl) is left out"), std::string::npos);
  EXPECT_EQ(Count(Figure(r.html, "accuracy"), "<circle class=\"marker\""), 3u);
  // The plan's rounds still to come are on the privacy plot's axis.
  EXPECT_NE(Figure(r.html, "epsilon")
                .find("rounds 3\xE2\x80\x93"
                      "4"),
            std::string::npos);
}

TEST(ReportTest, MissingFilesAreNoDataYet) {
  JobDir d;
  const Report r = Render(d.path());
  EXPECT_EQ(r.state, "running: 0 rounds so far");
  for (const char* id : {"accuracy", "loss", "duration", "participation", "traffic"}) {
    const std::string figure = Figure(r.html, id);
    EXPECT_NE(figure.find("plot-svg empty"), std::string::npos) << id;
    EXPECT_NE(figure.find("no data yet"), std::string::npos) << id;
  }
  EXPECT_NE(r.html.find(EscapeText("not known yet (model.bin is written at the end)")),
            std::string::npos);
  ExpectSelfContained(r.html);
}

TEST(ReportTest, ADamagedLineIsAnErrorNamingTheFileAndTheLine) {
  JobDir d;
  d.AppendRow("metrics.jsonl", JobDir::PlainRound(1));
  d.Append("metrics.jsonl", "[1, 2]\n");
  StatusOr<Report> r = RenderReport(d.path(), {});
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(absl::IsDataLoss(r.status()));
  EXPECT_NE(r.status().message().find("metrics.jsonl:2: not a JSON object"), std::string::npos)
      << r.status();
  JobDir s;
  s.Write("summary.json", "{\"job\": \"x\", ");
  r = RenderReport(s.path(), {});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("summary.json: not valid JSON"), std::string::npos)
      << r.status();
  // A value of an unexpected type is not plotted; it never ends the program.
  JobDir t;
  json odd = JobDir::PlainRound(1);
  odd["test_accuracy"] = "high";
  odd["upload_s"] = 3;
  t.AppendRow("metrics.jsonl", odd);
  t.WriteJson("privacy.json", {{"private", "yes"}, {"noise_schedule", 7}, {"rounds", "all"}});
  EXPECT_TRUE(RenderReport(t.path(), {}).ok());
}

TEST(ReportTest, ANameThatIsNoDirectoryIsRefused) {
  EXPECT_TRUE(absl::IsNotFound(RenderReport("/nonexistent/huddle-out", {}).status()));
  JobDir d;
  d.Write("file", "x");
  EXPECT_TRUE(absl::IsInvalidArgument(RenderReport(d / "file", {}).status()));
}

TEST(ReportTest, HostileTextIsEscapedEverywhere) {
  JobDir d;
  const std::string hostile = "<script>alert('x')</script>&\"<img src=http://evil/>";
  WriteDpJob(d, 2, /*finished=*/true);
  d.WriteJson("summary.json", {{"job", hostile}, {"stopped_early", hostile}, {"rounds", 4}});
  json privacy = {{"job", hostile},
                  {"private", false},
                  {"not_private_because", {hostile}},
                  {"accountant", hostile}};
  d.WriteJson("privacy.json", privacy);
  ReportOptions options;
  options.state = "failed";
  options.state_reason = hostile;
  for (bool op : {false, true}) {
    const Report r = Render(d.path(), op, options);
    EXPECT_EQ(r.html.find("<script"), std::string::npos);
    EXPECT_EQ(r.html.find("<img"), std::string::npos);
    EXPECT_EQ(r.html.find("alert('x')"), std::string::npos);
    EXPECT_NE(
        r.html.find("<h1>Huddle report: &lt;script&gt;alert&#40;&#39;x&#39;&#41;&lt;/script&gt;"
                    "&amp;&quot;&lt;img src&#61;http"),
        std::string::npos);
    EXPECT_NE(r.html.find("NOT PRIVATE: &lt;script&gt;"), std::string::npos);
    ExpectSelfContained(r.html, /*urls_in_text=*/true);
  }
}

TEST(ReportTest, UnderDpHowAJobFailedIsForTheOperator) {
  JobDir d;
  WriteDpJob(d, 4, /*finished=*/true);
  ReportOptions options;
  options.state = "failed";
  options.state_reason = "no round accepted an update";
  const Report pub = Render(d.path(), false, options);
  EXPECT_EQ(pub.state, "finished: 4 rounds of 4 planned") << "the same words as a success";
  EXPECT_EQ(pub.html.find("no round accepted"), std::string::npos);
  const Report op = Render(d.path(), true, options);
  EXPECT_EQ(op.state, "failed: 4 rounds of 4 planned (no round accepted an update)");
  // The same from summary.json's operator object, without the service's record.
  json summary = json::parse(ReadAllForTest(d / "summary.json"));
  summary["operator"]["failed"] = "no round accepted an update";
  d.WriteJson("summary.json", summary);
  EXPECT_EQ(Render(d.path()).state, "finished: 4 rounds of 4 planned");
  EXPECT_EQ(Render(d.path(), true).state,
            "failed: 4 rounds of 4 planned (no round accepted an update)");
}

TEST(ReportTest, AnAsynchronousJobOnAVirtualClockSaysSo) {
  JobDir d;
  for (int r = 1; r <= 4; ++r) {
    json row = JobDir::PlainRound(r);
    row["async"] = {{"buffer", 10}, {"concurrency", 100}, {"in_flight", 99}};
    d.AppendRow("metrics.jsonl", row);
  }
  // While it runs (no summary yet) its rows say it is asynchronous.
  Report running = Render(d.path());
  EXPECT_NE(running.html.find(EscapeText("buffered asynchronous (per server step)")),
            std::string::npos);
  EXPECT_NE(running.state.find("4 steps"), std::string::npos) << running.state;
  d.WriteJson("summary.json",
              {{"job", "async-job"},
               {"rounds", 4},
               {"rounds_completed", 4},
               {"final_test_accuracy", 0.7},
               {"best_test_accuracy", 0.7},
               {"best_round", 4},
               {"elapsed_s", 12.5},
               {"training",
                {{"mode", "async"}, {"concurrency", 100}, {"buffer", 10}, {"clock", "virtual"}}}});
  const Report r = Render(d.path());
  EXPECT_EQ(r.state, "finished: 4 steps of 4 planned");
  EXPECT_NE(r.html.find(EscapeText("buffered asynchronous (per server step): concurrency 100, "
                                   "buffer 10; simulated on a virtual clock")),
            std::string::npos);
  EXPECT_NE(r.html.find("at step 4"), std::string::npos);
  EXPECT_NE(r.html.find(EscapeText("12.5 s of virtual time (simulated)")), std::string::npos);
  EXPECT_EQ(r.html.find("of wall time"), std::string::npos);
}

TEST(ReportTest, ADatacenterJobIsPlottedPerEpoch) {
  JobDir d;
  for (int e = 1; e <= 3; ++e) {
    d.AppendRow("metrics.jsonl", {{"epoch", e},
                                  {"epoch_seconds", 2.0},
                                  {"seconds", 2.0 * e},
                                  {"steps", 1000 * e},
                                  {"test_accuracy", 0.8},
                                  {"test_loss", 0.5},
                                  {"train_accuracy", 0.81},
                                  {"train_loss", 0.52},
                                  {"world_size", 2}});
  }
  d.WriteJson("summary.json", {{"job", "dc"}, {"world_size", 2}, {"backend", "gloo"}});
  const Report r = Render(d.path());
  EXPECT_EQ(r.state, "finished: 3 epochs");
  EXPECT_NE(r.html.find(EscapeText("datacenter: 2 ranks (gloo)")), std::string::npos);
  EXPECT_EQ(Count(Figure(r.html, "accuracy"), "<g class=\"series\""), 2u) << "test and training";
  EXPECT_EQ(Count(Figure(r.html, "loss"), "<g class=\"series\""), 2u);
  // 2 s over 1000 steps: 2 ms a step.
  EXPECT_NE(Figure(r.html, "step_time").find("epoch 3: 2 ms"), std::string::npos)
      << Figure(r.html, "step_time");
  EXPECT_EQ(Figure(r.html, "duration"), "") << "rounds are federated";
  ExpectSelfContained(r.html);
}

TEST(ReportTest, ADatacenterDpJobKeepsTheRanksTrainingValuesForTheOperator) {
  JobDir d;
  for (int e = 1; e <= 2; ++e) {
    d.AppendRow("metrics.jsonl", {{"epoch", e},
                                  {"epsilon", 0.5 * e},
                                  {"delta", 1e-5},
                                  {"private", true},
                                  {"steps", 30 * e},
                                  {"test_accuracy", 0.7},
                                  {"test_loss", 0.9}});
    d.AppendRow("operator_metrics.jsonl", {{"epoch", e},
                                           {"epoch_seconds", kSecretDuration},
                                           {"steps", 30 * e},
                                           {"train_accuracy", 0.6},
                                           {"train_loss", 1.1}});
  }
  d.WriteJson("privacy.json", {{"scope", "datacenter"},
                               {"budget_epsilon", 3.0},
                               {"releases",
                                {{{"rounds", {1, 2}},
                                  {"noise_multiplier", 1.9287},
                                  {"clip_norm", 1.0},
                                  {"sampling_rate", 0.0341}}}}});
  const Report pub = Render(d.path());
  EXPECT_EQ(pub.left_out,
            (std::vector<std::string>{"Training accuracy", "Training loss", "Time per step"}));
  EXPECT_NE(Figure(pub.html, "epsilon")
                .find("epochs 1\xE2\x80\x93"
                      "2: z 1.929, C 1, q 0.0341"),
            std::string::npos)
      << Figure(pub.html, "epsilon");
  EXPECT_EQ(Count(Figure(pub.html, "accuracy"), "<g class=\"series\""), 1u) << "test only";
  const Report op = Render(d.path(), true);
  for (const char* id : {"train_accuracy", "train_loss", "step_time"}) {
    EXPECT_NE(Figure(op.html, id).find(kOperatorOnlyLabel), std::string::npos) << id;
    EXPECT_EQ(Figure(op.html, id).find("plot-svg empty"), std::string::npos) << id;
  }
}

TEST(ReportTest, ALongJobsPageStaysSmall) {
  JobDir d;
  std::string rows;
  for (int r = 1; r <= 20000; ++r) rows += JobDir::PlainRound(r).dump() + "\n";
  d.Write("metrics.jsonl", rows);
  const Report r = Render(d.path());
  EXPECT_LT(r.html.size(), size_t{1} << 20) << "every series thinned to 2,000 points";
  EXPECT_EQ(Count(r.html, "<circle"), 0u) << "no markers on long series";
  EXPECT_NE(r.state.find("20000 rounds"), std::string::npos);
}

}  // namespace
}  // namespace huddle::report
