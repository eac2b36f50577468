// The Prometheus text writer: exact expositions, escaping, value formatting, the histogram's
// arithmetic, every rule Render() enforces, and promtool's verdict on a full exposition.
#include "service/prometheus.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <sstream>

namespace huddle::service {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

Histogram MakeHistogram(std::vector<double> bounds) {
  StatusOr<Histogram> h = Histogram::Create(std::move(bounds));
  EXPECT_TRUE(h.ok()) << h.status();
  return *std::move(h);
}

std::string RenderOk(const std::vector<MetricFamily>& families) {
  StatusOr<std::string> text = Render(families);
  EXPECT_TRUE(text.ok()) << text.status();
  return text.ok() ? *text : "";
}

// Render() refuses `families` with InvalidArgument whose message holds `fragment`.
void ExpectRefused(const std::vector<MetricFamily>& families, const std::string& fragment) {
  StatusOr<std::string> text = Render(families);
  ASSERT_FALSE(text.ok()) << "rendered:\n" << *text;
  EXPECT_EQ(text.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(text.status().message()).find(fragment), std::string::npos)
      << text.status();
}

TEST(PrometheusRenderTest, Counter) {
  EXPECT_EQ(RenderOk({MetricFamily::Counter("huddle_rounds_total", "Rounds completed.").Add(42)}),
            "# HELP huddle_rounds_total Rounds completed.\n"
            "# TYPE huddle_rounds_total counter\n"
            "huddle_rounds_total 42\n");
}

TEST(PrometheusRenderTest, GaugeWithLabelsInTheOrderGiven) {
  MetricFamily gauge = MetricFamily::Gauge("huddle_clients", "Clients connected, by job.");
  gauge.Add({{"job", "mnist"}, {"state", "training"}}, 3)
      .Add({{"state", "idle"}, {"job", "cifar"}}, 0.5)
      .Add({}, -2);
  EXPECT_EQ(RenderOk({gauge}),
            "# HELP huddle_clients Clients connected, by job.\n"
            "# TYPE huddle_clients gauge\n"
            "huddle_clients{job=\"mnist\",state=\"training\"} 3\n"
            "huddle_clients{state=\"idle\",job=\"cifar\"} 0.5\n"
            "huddle_clients -2\n");
}

TEST(PrometheusRenderTest, HistogramIsCumulativeWithInfSumAndCount) {
  Histogram h = MakeHistogram({0.1, 1, 10});
  for (double v : {0.05, 0.1, 0.5, 3.0, 100.0}) h.Observe(v);
  EXPECT_EQ(RenderOk({MetricFamily::HistogramFamily("huddle_round_seconds", "Round duration.")
                          .Add({{"job", "a"}}, h)}),
            "# HELP huddle_round_seconds Round duration.\n"
            "# TYPE huddle_round_seconds histogram\n"
            "huddle_round_seconds_bucket{job=\"a\",le=\"0.1\"} 2\n"
            "huddle_round_seconds_bucket{job=\"a\",le=\"1\"} 3\n"
            "huddle_round_seconds_bucket{job=\"a\",le=\"10\"} 4\n"
            "huddle_round_seconds_bucket{job=\"a\",le=\"+Inf\"} 5\n"
            "huddle_round_seconds_sum{job=\"a\"} 103.65\n"
            "huddle_round_seconds_count{job=\"a\"} 5\n");
}

TEST(PrometheusRenderTest, HistogramWithoutLabelsOrObservations) {
  EXPECT_EQ(RenderOk({MetricFamily::HistogramFamily("x_bytes", "X.").Add({}, MakeHistogram({1}))}),
            "# HELP x_bytes X.\n# TYPE x_bytes histogram\n"
            "x_bytes_bucket{le=\"1\"} 0\nx_bytes_bucket{le=\"+Inf\"} 0\n"
            "x_bytes_sum 0\nx_bytes_count 0\n");
}

TEST(PrometheusRenderTest, InfoIsAGaugeOfOne) {
  EXPECT_EQ(RenderOk({MetricFamily::Info("huddle_build_info", "The build.",
                                         {{"version", "0.1.0"}, {"revision", "abc123"}})}),
            "# HELP huddle_build_info The build.\n# TYPE huddle_build_info gauge\n"
            "huddle_build_info{version=\"0.1.0\",revision=\"abc123\"} 1\n");
}

TEST(PrometheusRenderTest, EscapesHelpAndLabelValues) {
  MetricFamily gauge = MetricFamily::Gauge("g", "a \\ b\nc \"quoted\"");
  gauge.Add({{"path", "C:\\dir\n\"x\""}}, 1);
  EXPECT_EQ(RenderOk({gauge}),
            "# HELP g a \\\\ b\\nc \"quoted\"\n# TYPE g gauge\n"
            "g{path=\"C:\\\\dir\\n\\\"x\\\"\"} 1\n");
}

TEST(PrometheusRenderTest, FamiliesInOrderAndEmptyFamiliesWriteNothing) {
  EXPECT_EQ(RenderOk({MetricFamily::Gauge("b", "B.").Add(1), MetricFamily::Gauge("empty", "E."),
                      MetricFamily::Gauge("a", "A.").Add(2)}),
            "# HELP b B.\n# TYPE b gauge\nb 1\n# HELP a A.\n# TYPE a gauge\na 2\n");
  EXPECT_EQ(RenderOk({}), "");
}

TEST(PrometheusValueTest, FormatsAsPrometheusReadsBack) {
  EXPECT_EQ(FormatPrometheusValue(0), "0");
  EXPECT_EQ(FormatPrometheusValue(-0.0), "0");
  EXPECT_EQ(FormatPrometheusValue(1), "1");
  EXPECT_EQ(FormatPrometheusValue(-17), "-17");
  EXPECT_EQ(FormatPrometheusValue(1234567), "1234567");
  EXPECT_EQ(FormatPrometheusValue(9007199254740991.0), "9007199254740991");
  EXPECT_EQ(FormatPrometheusValue(0.1), "0.1");
  EXPECT_EQ(FormatPrometheusValue(0.1 + 0.2), "0.30000000000000004");
  EXPECT_EQ(FormatPrometheusValue(2.5e-7), "2.5e-07");
  EXPECT_EQ(FormatPrometheusValue(1e20), "1e+20");
  EXPECT_EQ(FormatPrometheusValue(kInf), "+Inf");
  EXPECT_EQ(FormatPrometheusValue(-kInf), "-Inf");
  EXPECT_EQ(FormatPrometheusValue(kNaN), "NaN");
  for (double v : {0.1, 1.0 / 3, 6.02214076e23, 5e-324, 1.7976931348623157e308, -123.456}) {
    EXPECT_EQ(std::strtod(FormatPrometheusValue(v).c_str(), nullptr), v) << v;
  }
}

TEST(HistogramTest, BoundsAreInclusiveAndNaNCountsInInf) {
  Histogram h = MakeHistogram({1, 2});
  h.Observe(1);    // le=1
  h.Observe(1.5);  // le=2
  h.Observe(-5);   // le=1
  h.Observe(kNaN);
  EXPECT_EQ(h.CumulativeCounts(), (std::vector<uint64_t>{2, 3, 4}));
  EXPECT_EQ(h.count(), 4u);
  EXPECT_TRUE(std::isnan(h.sum()));
}

TEST(HistogramTest, ExponentialBounds) {
  StatusOr<Histogram> h = Histogram::Exponential(0.001, 10, 4);
  ASSERT_TRUE(h.ok()) << h.status();
  ASSERT_EQ(h->upper_bounds().size(), 4u);
  EXPECT_DOUBLE_EQ(h->upper_bounds()[3], 1.0);
  EXPECT_FALSE(Histogram::Exponential(0, 2, 3).ok());
  EXPECT_FALSE(Histogram::Exponential(1, 1, 3).ok());
  EXPECT_FALSE(Histogram::Exponential(1, 2, 0).ok());
}

TEST(HistogramTest, RefusesUnorderedOrInfiniteBounds) {
  EXPECT_TRUE(Histogram::Create({}).ok());
  EXPECT_FALSE(Histogram::Create({1, 1}).ok());
  EXPECT_FALSE(Histogram::Create({2, 1}).ok());
  EXPECT_FALSE(Histogram::Create({1, kInf}).ok());
  EXPECT_FALSE(Histogram::Create({kNaN}).ok());
}

TEST(PrometheusNameTest, Grammar) {
  for (const char* ok : {"a", "_a", "a:b", ":a", "A_1"}) EXPECT_TRUE(IsValidMetricName(ok)) << ok;
  for (const char* bad : {"", "1a", "a-b", "a b", "é"}) EXPECT_FALSE(IsValidMetricName(bad)) << bad;
  for (const char* ok : {"a", "_a", "A_1", "_"}) EXPECT_TRUE(IsValidLabelName(ok)) << ok;
  for (const char* bad : {"", "1a", "a:b", "__a", "a-b"}) {
    EXPECT_FALSE(IsValidLabelName(bad)) << bad;
  }
}

TEST(PrometheusRefuseTest, BadNames) {
  ExpectRefused({MetricFamily::Gauge("1abc", "H.").Add(1)}, "does not match");
  ExpectRefused({MetricFamily::Gauge("a-b", "H.").Add(1)}, "does not match");
  ExpectRefused({MetricFamily::Gauge("rule:x", "H.").Add(1)}, "recording rules");
  ExpectRefused({MetricFamily::Gauge("g", "H.").Add({{"1x", "v"}}, 1)}, "label name '1x'");
  ExpectRefused({MetricFamily::Gauge("g", "H.").Add({{"__name__", "v"}}, 1)}, "'__name__'");
  ExpectRefused({MetricFamily::Gauge("g", "H.").Add({{"le", "1"}}, 1)}, "reserved");
  ExpectRefused({MetricFamily::Gauge("g", "H.").Add({{"quantile", "1"}}, 1)}, "reserved");
  ExpectRefused({MetricFamily::HistogramFamily("h", "H.").Add({{"le", "1"}}, MakeHistogram({}))},
                "reserved");
}

TEST(PrometheusRefuseTest, TypeSuffixRules) {
  ExpectRefused({MetricFamily::Counter("requests", "H.").Add(1)}, "must end in '_total'");
  ExpectRefused({MetricFamily::Gauge("requests_total", "H.").Add(1)}, "only a counter");
  ExpectRefused({MetricFamily::Info("build", "H.", {})}, "must end in '_info'");
  ExpectRefused({MetricFamily::Gauge("queue_count", "H.").Add(1)}, "'_count'");
  ExpectRefused({MetricFamily::Gauge("latency_sum", "H.").Add(1)}, "'_sum'");
  ExpectRefused({MetricFamily::HistogramFamily("x_bucket", "H.")}, "'_bucket'");
}

TEST(PrometheusRefuseTest, HelpMustBePresentAndUtf8) {
  ExpectRefused({MetricFamily::Gauge("g", "").Add(1)}, "HELP text is empty");
  ExpectRefused({MetricFamily::Gauge("g", "bad \xff byte").Add(1)}, "UTF-8");
  ExpectRefused({MetricFamily::Gauge("g", "overlong \xc0\xaf").Add(1)}, "UTF-8");
  ExpectRefused({MetricFamily::Gauge("g", "surrogate \xed\xa0\x80").Add(1)}, "UTF-8");
  ExpectRefused({MetricFamily::Gauge("g", "cut \xe2\x82").Add(1)}, "UTF-8");
  EXPECT_TRUE(Render({MetricFamily::Gauge("g", "euro \xe2\x82\xac, 𝄞").Add(1)}).ok());
}

TEST(PrometheusRefuseTest, BadLabelSets) {
  ExpectRefused({MetricFamily::Gauge("g", "H.").Add({{"a", "1"}, {"a", "2"}}, 1)},
                "'a' appears twice");
  ExpectRefused({MetricFamily::Gauge("g", "H.")
                     .Add({{"a", "1"}, {"b", "2"}}, 1)
                     .Add({{"b", "2"}, {"a", "1"}}, 2)},
                "sample 1 repeats the label set");
  ExpectRefused({MetricFamily::Gauge("g", "H.").Add(1).Add(2)}, "repeats the label set");
  ExpectRefused({MetricFamily::Gauge("g", "H.").Add({{"a", "\xff"}}, 1)}, "non-UTF-8 value");
}

TEST(PrometheusRefuseTest, DuplicateFamilies) {
  ExpectRefused({MetricFamily::Gauge("g", "H.").Add(1), MetricFamily::Gauge("g", "H.").Add(2)},
                "already used by family 'g'");
  ExpectRefused({MetricFamily::HistogramFamily("t_seconds", "H."),
                 MetricFamily::Gauge("t_seconds", "H.").Add(1)},
                "already used");
  ExpectRefused({MetricFamily::Counter("c_total", "H."), MetricFamily::Counter("c_total", "H.")},
                "already used");
}

TEST(PrometheusRefuseTest, BadValues) {
  ExpectRefused({MetricFamily::Counter("c_total", "H.").Add(-1)}, ">= 0, not -1");
  ExpectRefused({MetricFamily::Counter("c_total", "H.").Add(kNaN)}, "not NaN");
  ExpectRefused({MetricFamily::Info("b_info", "H.", {}).Add({{"x", "y"}}, 2)}, "must be 1");
  ExpectRefused({MetricFamily::Gauge("g", "H.").Add({}, MakeHistogram({1}))}, "holds a histogram");
  ExpectRefused({MetricFamily::HistogramFamily("h", "H.").Add(3)}, "holds a number");
  EXPECT_TRUE(Render({MetricFamily::Gauge("g", "H.").Add({{"a", "1"}}, kNaN).Add(-kInf)}).ok());
  EXPECT_TRUE(Render({MetricFamily::Counter("c_total", "H.").Add(kInf)}).ok());
}

// `promtool check metrics` (Debian: prometheus) parses and lints a full exposition.
TEST(PrometheusPromtoolTest, PromtoolAcceptsTheExposition) {
  if (std::system("command -v promtool >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "promtool is not installed (Debian package prometheus)";
  }
  Histogram h = *Histogram::Exponential(0.005, 4, 6);
  for (double v : {0.001, 0.02, 0.3, 2.0, 50.0}) h.Observe(v);
  MetricFamily rounds = MetricFamily::Counter("huddle_rounds_total", "Rounds completed.");
  rounds.Add({{"job", "mnist"}}, 12).Add({{"job", "odd \"name\"\n\\"}}, 0);
  const std::vector<MetricFamily> families = {
      MetricFamily::Info("huddle_build_info", "Build.", {{"version", "0.1.0"}}),
      rounds,
      MetricFamily::Gauge("huddle_clients_connected", "Clients, by\njob \\ state.")
          .Add({{"job", "mnist"}, {"state", "idle"}}, 3)
          .Add({{"job", "mnist"}, {"state", "training"}}, kNaN)
          .Add({{"job", "cifar"}, {"state", "idle"}}, -kInf),
      MetricFamily::Gauge("huddle_privacy_epsilon", "Epsilon spent.").Add(0.30000000000000004),
      MetricFamily::HistogramFamily("huddle_round_duration_seconds", "Round wall time.")
          .Add({{"job", "mnist"}}, h)
          .Add({{"job", "cifar"}}, *Histogram::Exponential(0.005, 4, 6)),
  };
  const std::string text = RenderOk(families);
  const std::string path =
      ::testing::TempDir() + "/huddle_exposition_" + std::to_string(getpid()) + ".txt";
  std::ofstream(path) << text;
  const std::string out_path = path + ".out";
  const int rc =
      std::system(("promtool check metrics < " + path + " > " + out_path + " 2>&1").c_str());
  std::stringstream out;
  out << std::ifstream(out_path).rdbuf();
  EXPECT_EQ(rc, 0) << "promtool check metrics said:\n" << out.str() << "\non:\n" << text;
  std::remove(path.c_str());
  std::remove(out_path.c_str());
}

}  // namespace
}  // namespace huddle::service
