// deploy/grafana/huddle-service.json queries only what the service exposes: every metric name in
// its expressions is a family (or a histogram family's _bucket/_sum/_count) of ServiceMetrics.
#include <gtest/gtest.h>

#include <cctype>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "service/service_metrics.h"

namespace huddle::service {
namespace {

TEST(GrafanaDashboardTest, EveryQueryNamesAFamilyTheServiceExposes) {
  ServiceMetrics metrics;
  metrics.OnJobStart("j", 10);
  metrics.OnRound("j",
                  R"({"round":1,"test_accuracy":0.5,"test_loss":1,"epsilon":0.5,)"
                  R"("privacy":{"budget_epsilon":3}})",
                  R"({"round":1,"results":2,"dropped":1,"duration_s":0.2,"bytes_in":5})");
  ServiceCounts counts;
  counts.jobs_by_state["running"] = 1;
  std::set<std::string> names;
  for (const MetricFamily& f : metrics.Families(counts, /*operator_families=*/true)) {
    names.insert(f.name());
    if (f.type() == MetricType::kHistogram) {
      for (const char* suffix : {"_bucket", "_sum", "_count"}) names.insert(f.name() + suffix);
    }
  }
  std::ifstream in(std::string(HUDDLE_SOURCE_DIR) + "/deploy/grafana/huddle-service.json");
  ASSERT_TRUE(in.good());
  std::stringstream text;
  text << in.rdbuf();
  const nlohmann::json dashboard = nlohmann::json::parse(text.str());
  // Every run of "huddle_" followed by [a-z_] (no std::regex: GCC 12 warns falsely inside it
  // under ASan).
  auto names_in = [](const std::string& expr) {
    std::vector<std::string> out;
    for (size_t at = expr.find("huddle_"); at != std::string::npos;
         at = expr.find("huddle_", at + 1)) {
      size_t end = at + 7;
      while (end < expr.size() &&
             (std::islower(static_cast<unsigned char>(expr[end])) || expr[end] == '_')) {
        ++end;
      }
      out.push_back(expr.substr(at, end - at));
      at = end - 1;
    }
    return out;
  };
  int queries = 0;
  for (const auto& panel : dashboard["panels"]) {
    for (const auto& target : panel["targets"]) {
      const std::string expr = target["expr"];
      ++queries;
      for (const std::string& name : names_in(expr)) {
        if (name == "huddle_job") continue;  // the label
        EXPECT_TRUE(names.count(name)) << panel["title"] << ": " << name << " in " << expr;
      }
    }
  }
  EXPECT_GE(queries, 10);
}

// The public families carry nothing of the operator rows (counts, bytes, durations): what a
// public scrape shows under DP is what metrics.jsonl shows.
TEST(ServiceMetricsTest, PublicFamiliesHoldNoOperatorOnlyValue) {
  ServiceMetrics metrics;
  metrics.OnJobStart("j", 10);
  metrics.OnRound("j", R"({"round":3,"test_accuracy":0.75,"epsilon":1.5})",
                  R"({"round":3,"results":7,"dropped":2,"duration_s":12.5,"bytes_in":987654})");
  metrics.OnOperatorRequest("jobs", true);
  ServiceCounts counts;
  counts.bytes_in = 123456789;
  const auto rendered = Render(metrics.Families(counts, /*operator_families=*/false));
  ASSERT_TRUE(rendered.ok()) << rendered.status();
  EXPECT_EQ(rendered->find("huddle_operator_"), std::string::npos) << *rendered;
  for (const char* secret : {"987654", "123456789", "12.5"}) {
    EXPECT_EQ(rendered->find(secret), std::string::npos) << secret << " in " << *rendered;
  }
  EXPECT_NE(rendered->find("huddle_job_round{huddle_job=\"j\"} 3"), std::string::npos);
  EXPECT_NE(rendered->find("huddle_job_privacy_epsilon{huddle_job=\"j\"} 1.5"), std::string::npos);
  const auto all = Render(metrics.Families(counts, /*operator_families=*/true));
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_NE(
      all->find("huddle_operator_round_members_total{huddle_job=\"j\",outcome=\"dropped\"} 2"),
      std::string::npos)
      << *all;
}

// Each contributing member's upload (the operator row's `upload_seconds`) is one observation of
// an operator-only histogram; a public scrape shows none of it.
TEST(ServiceMetricsTest, UploadDurationsFeedAnOperatorOnlyHistogram) {
  ServiceMetrics metrics;
  metrics.OnJobStart("j", 10);
  metrics.OnRound("j", R"({"round":1})",
                  R"({"round":1,"results":3,"duration_s":4,"upload_s":{"count":3},)"
                  R"("upload_seconds":[0.004,0.3,75]})");
  metrics.OnRound("j", R"({"round":2})", R"({"round":2,"results":1,"upload_seconds":[2]})");
  const MetricFamily* uploads = nullptr;
  const std::vector<MetricFamily> families = metrics.Families(ServiceCounts{}, true);
  for (const MetricFamily& f : families) {
    if (f.name() == "huddle_operator_upload_duration_seconds") uploads = &f;
  }
  ASSERT_NE(uploads, nullptr);
  EXPECT_EQ(uploads->type(), MetricType::kHistogram);
  ASSERT_EQ(uploads->samples().size(), 1u);
  EXPECT_EQ(uploads->samples()[0].labels, (Labels{{"huddle_job", "j"}}));
  const Histogram& h = std::get<Histogram>(uploads->samples()[0].value);
  EXPECT_EQ(h.upper_bounds(),
            (std::vector<double>{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}));
  EXPECT_EQ(h.count(), 4u);
  EXPECT_DOUBLE_EQ(h.sum(), 77.304);
  const auto rendered = Render(families);
  ASSERT_TRUE(rendered.ok()) << rendered.status();
  for (const char* line :
       {"huddle_operator_upload_duration_seconds_bucket{huddle_job=\"j\",le=\"0.005\"} 1\n",
        "huddle_operator_upload_duration_seconds_bucket{huddle_job=\"j\",le=\"0.25\"} 1\n",
        "huddle_operator_upload_duration_seconds_bucket{huddle_job=\"j\",le=\"0.5\"} 2\n",
        "huddle_operator_upload_duration_seconds_bucket{huddle_job=\"j\",le=\"2.5\"} 3\n",
        "huddle_operator_upload_duration_seconds_bucket{huddle_job=\"j\",le=\"60\"} 3\n",
        "huddle_operator_upload_duration_seconds_bucket{huddle_job=\"j\",le=\"+Inf\"} 4\n",
        "huddle_operator_upload_duration_seconds_count{huddle_job=\"j\"} 4\n",
        "# TYPE huddle_operator_upload_duration_seconds histogram\n"}) {
    EXPECT_NE(rendered->find(line), std::string::npos) << line << " not in\n" << *rendered;
  }
  for (const MetricFamily& f : metrics.Families(ServiceCounts{}, /*operator_families=*/false)) {
    EXPECT_NE(f.name(), "huddle_operator_upload_duration_seconds");
  }
}

// A long-lived service keeps the series of its last 32 finished jobs, not of every job ever run.
TEST(ServiceMetricsTest, FinishedJobsSeriesAreBounded) {
  ServiceMetrics metrics;
  for (int i = 0; i < 100; ++i) {
    const std::string job = "j" + std::to_string(i);
    metrics.OnJobStart(job, 1);
    metrics.OnRound(job, R"({"round":1})", R"({"round":1})");
    metrics.OnJobEnd(job);
  }
  int series = 0;
  for (const MetricFamily& f : metrics.Families(ServiceCounts{}, false)) {
    if (f.name() == "huddle_job_round") series = static_cast<int>(f.samples().size());
  }
  EXPECT_EQ(series, static_cast<int>(ServiceMetrics::kFinishedJobsKept));
}

}  // namespace
}  // namespace huddle::service
