#include "privacy/report.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

namespace huddle::privacy {
namespace {

LedgerEntry Entry(uint64_t round, double z, const char* adjacency = kAddRemove, double q = 0.1) {
  LedgerEntry e;
  e.round = round;
  e.sampling_rate = q;
  e.noise_multiplier = z;
  e.clip_norm = 1.0;
  e.mode = "central";
  e.noise = "os-csprng";
  e.adjacency = adjacency;
  return e;
}

TEST(PrivacyReportTest, GroupsConsecutiveEqualReleases) {
  const std::vector<LedgerEntry> entries = {Entry(1, 1.0), Entry(2, 1.0), Entry(3, 2.0),
                                            Entry(4, 2.0), Entry(5, 1.0)};
  const auto runs = GroupReleases(entries);
  ASSERT_EQ(runs.size(), 3u);
  EXPECT_EQ(runs[0].first_round, 1u);
  EXPECT_EQ(runs[0].last_round, 2u);
  EXPECT_EQ(runs[0].entries, 2);
  EXPECT_EQ(runs[1].noise_multiplier, 2.0);
  EXPECT_EQ(runs[2].first_round, 5u);
  const auto local = GroupReleases(std::vector<LedgerEntry>{Entry(1, 3.0, kReplaceOne, 1.0)});
  EXPECT_EQ(local[0].accounted_noise_multiplier, 1.5);
}

TEST(PrivacyReportTest, NotPrivateRunsHaveNoEpsilon) {
  PrivacyReport r;
  r.job = "j";
  r.nominal_epsilon = 8;
  r.delta = 1e-5;
  r.is_private = false;
  r.not_private_because = {"seeded noise"};
  const auto j = nlohmann::json::parse(PrivacyReportJson(r));
  EXPECT_TRUE(j["epsilon"].is_null());
  EXPECT_EQ(j["nominal_epsilon"], 8);
  EXPECT_EQ(j["private"], false);
  r.is_private = true;
  const auto k = nlohmann::json::parse(PrivacyReportJson(r));
  EXPECT_EQ(k["epsilon"], 8);
  EXPECT_FALSE(k.contains("nominal_epsilon"));
}

// A federated DP job restates its plan: the noise schedule, the epsilon all its rounds would
// spend, and the rounds planned against the rounds run.
TEST(PrivacyReportTest, TheFederatedPlanIsRestated) {
  PrivacyReport r;
  r.job = "j";
  r.nominal_epsilon = 2.9;
  r.delta = 1e-5;
  r.budget_epsilon = 3.0;
  ReportPlan plan;
  plan.rounds_planned = 40;
  plan.rounds_run = 6;
  plan.epsilon = 7.9;
  plan.stop_at_budget = true;
  plan.noise_schedule = {{1, 20, 2.0, 1.0}, {21, 40, 3.5, 0.5}};
  r.plan = plan;
  const auto j = nlohmann::json::parse(PrivacyReportJson(r));
  EXPECT_EQ(j["rounds"]["planned"], 40);
  EXPECT_EQ(j["rounds"]["run"], 6);
  EXPECT_EQ(j["planned_epsilon"], 7.9);
  EXPECT_EQ(j["stop_at_budget"], true);
  ASSERT_EQ(j["noise_schedule"].size(), 2u);
  EXPECT_EQ(j["noise_schedule"][1]["rounds"], nlohmann::json::array({21, 40}));
  EXPECT_EQ(j["noise_schedule"][1]["noise_multiplier"], 3.5);
  EXPECT_EQ(j["noise_schedule"][1]["clip_norm"], 0.5);
  // Reports of other jobs (DP-SGD, the datacenter) have no federated plan.
  r.plan.reset();
  const auto k = nlohmann::json::parse(PrivacyReportJson(r));
  EXPECT_FALSE(k.contains("rounds"));
  EXPECT_FALSE(k.contains("noise_schedule"));
}

}  // namespace
}  // namespace huddle::privacy
