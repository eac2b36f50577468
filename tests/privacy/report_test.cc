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

}  // namespace
}  // namespace huddle::privacy
