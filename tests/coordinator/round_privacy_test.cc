// Round privacy as a part of its own (coordinator/round_privacy.h), driven directly: the budget
// check before a round, the round's settings and update check, and the release, whose ledger entry
// is durable before the mean exists.
#include "coordinator/round_privacy.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "privacy/ledger.h"
#include "privacy/report.h"
#include "tests/testing/temp_dir.h"

namespace huddle::coordinator {
namespace {

const ModelLayout kLayout = {{"w", DType::kFloat32, {4, 3}}, {"b", DType::kFloat32, {3}}};

int LedgerLines(const std::string& dir) {
  std::ifstream in(std::filesystem::path(dir) / privacy::kLedgerFile);
  int lines = 0;
  for (std::string line; std::getline(in, line);) lines += line.empty() ? 0 : 1;
  return lines;
}

class RoundPrivacyTest : public ::testing::Test {
 protected:
  CoordinatorOptions Central(double total_epsilon = 100) {
    CoordinatorOptions o;
    o.job_name = "round-privacy";
    o.rounds = 10;
    o.cohort.sampling = CohortOptions::Sampling::kPoisson;
    o.cohort.rate = 0.5;
    o.privacy.mode = privacy::PrivacyMode::kCentral;
    o.privacy.clip_norm = 1.0;
    o.privacy.total_epsilon = total_epsilon;
    o.privacy.expected_cohort_size = 4;
    o.privacy.noise_seed = 11;  // reproducible (not private)
    o.out_dir = dirs_.Make("round_privacy");
    return o;
  }

  aggregation::StreamingAggregator Aggregator() {
    auto agg = aggregation::StreamingAggregator::Create(kLayout);
    EXPECT_TRUE(agg.ok()) << agg.status();
    return *std::move(agg);
  }

  // Folds `n` updates of `value` in every coordinate, each checked against the round first.
  void FoldUpdates(const RoundPrivacy& p, const PrivateRound& round,
                   aggregation::StreamingAggregator* agg, int n, float value) {
    std::vector<std::vector<float>> data;
    for (const TensorSpec& s : kLayout) {
      data.emplace_back(static_cast<size_t>(s.NumElements()), value);
    }
    std::vector<std::span<const float>> spans(data.begin(), data.end());
    for (int i = 0; i < n; ++i) {
      ASSERT_TRUE(p.CheckUpdate(round, spans).ok());
      ASSERT_TRUE(agg->Fold(spans, 1).ok());
    }
  }

  testing::TempDirs dirs_;
};

TEST_F(RoundPrivacyTest, WithoutDpItIsDisabledAndKeepsTheCheckpointsClipNorm) {
  CoordinatorOptions o;
  o.out_dir = dirs_.Make("no_dp");
  auto p = RoundPrivacy::Open(&o, 0.25, 3);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_FALSE(p->enabled());
  EXPECT_FALSE(p->secret_sampling());
  EXPECT_TRUE(p->private_noise());
  EXPECT_EQ(p->clip_norm(), 0.25);
  auto stop = p->StopBefore(1);
  ASSERT_TRUE(stop.ok());
  EXPECT_FALSE(stop->has_value());
  ASSERT_TRUE(p->WriteReport("").ok());
  EXPECT_FALSE(
      std::filesystem::exists(std::filesystem::path(o.out_dir) / privacy::kPrivacyReportFile));
  EXPECT_FALSE(std::filesystem::exists(std::filesystem::path(o.out_dir) / privacy::kLedgerFile));
}

TEST_F(RoundPrivacyTest, CentralDpNeedsPoissonCohortsAndAnOutputDirectory) {
  CoordinatorOptions fixed = Central();
  fixed.cohort.sampling = CohortOptions::Sampling::kFixed;
  auto p = RoundPrivacy::Open(&fixed, 0, 0);
  EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(p.status().message().find("cohort.sampling: poisson"), std::string::npos) << p.status();
  CoordinatorOptions nowhere = Central();
  nowhere.out_dir.clear();
  p = RoundPrivacy::Open(&nowhere, 0, 0);
  EXPECT_NE(p.status().message().find("output directory"), std::string::npos) << p.status();
}

TEST_F(RoundPrivacyTest, ARoundsUpdatesAreCheckedAgainstItsClipNorm) {
  CoordinatorOptions o = Central();
  auto p = RoundPrivacy::Open(&o, 0, 0);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_TRUE(p->enabled());
  EXPECT_FALSE(p->private_noise());
  aggregation::StreamingAggregator agg = Aggregator();
  PrivateRound round;
  ASSERT_TRUE(p->Configure(1, &round, &agg).ok());
  EXPECT_EQ(round.number, 1u);
  EXPECT_EQ(round.clip_norm, 1.0);
  EXPECT_GT(round.noise_multiplier, 0);
  EXPECT_EQ(round.expected_cohort, 4);
  const wire::UpdatePrivacy fit = p->Instruction(round);
  EXPECT_EQ(fit.mode, wire::UpdatePrivacy::Mode::kCentral);
  EXPECT_EQ(fit.clip_norm, 1.0);
  std::vector<float> longer(15, 0.5f);  // L2 norm sqrt(15) / 2 > 1
  std::vector<std::span<const float>> spans = {std::span<const float>(longer).first(12),
                                               std::span<const float>(longer).subspan(12)};
  Status st = p->CheckUpdate(round, spans);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("exceeds the round's clip norm"), std::string::npos) << st;
}

TEST_F(RoundPrivacyTest, TheReleaseIsInTheLedgerBeforeItsMeanIsReturned) {
  CoordinatorOptions o = Central();
  auto p = RoundPrivacy::Open(&o, 0, 0);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_FALSE(p->spent().has_value());
  aggregation::StreamingAggregator agg = Aggregator();
  PrivateRound round;
  ASSERT_TRUE(p->Configure(1, &round, &agg).ok());
  FoldUpdates(*p, round, &agg, 3, 0.1f);
  RoundMetrics metrics;
  TensorList mean;
  ASSERT_TRUE(p->Release(round, 3, &agg, nullptr, &metrics, &mean).ok());
  EXPECT_EQ(LedgerLines(o.out_dir), 1);
  ASSERT_TRUE(p->spent().has_value());
  EXPECT_GT(p->spent()->epsilon, 0);
  ASSERT_TRUE(metrics.privacy.has_value());
  EXPECT_EQ(metrics.privacy->epsilon, p->spent()->epsilon);
  EXPECT_EQ(metrics.privacy->mode, "central");
  ASSERT_EQ(mean.size(), kLayout.size());
  EXPECT_EQ(mean[0].data.size(), 12u);
  ASSERT_TRUE(p->WriteReport("").ok());
  EXPECT_TRUE(
      std::filesystem::exists(std::filesystem::path(o.out_dir) / privacy::kPrivacyReportFile));
}

TEST_F(RoundPrivacyTest, TheBudgetStopsTheRoundThatWouldPassIt) {
  // A schedule of z = 1 for 50 rounds: epsilon 1 is spent long before its end.
  CoordinatorOptions o = Central(/*total_epsilon=*/1.0);
  o.rounds = 50;
  privacy::ScheduleRange all;
  all.first_round = 1;
  all.last_round = 50;
  all.noise_multiplier = 1.0;
  o.privacy.schedule = {all};
  auto p = RoundPrivacy::Open(&o, 0, 0);
  ASSERT_TRUE(p.ok()) << p.status();
  std::optional<std::string> stop;
  for (uint64_t r = 1; r <= 50 && !stop; ++r) {
    auto over = p->StopBefore(r);
    ASSERT_TRUE(over.ok()) << over.status();
    stop = *over;
    if (stop) break;
    aggregation::StreamingAggregator agg = Aggregator();
    PrivateRound round;
    ASSERT_TRUE(p->Configure(r, &round, &agg).ok());
    RoundMetrics metrics;
    TensorList mean;
    ASSERT_TRUE(p->Release(round, 0, &agg, nullptr, &metrics, &mean).ok());
  }
  ASSERT_TRUE(stop.has_value()) << "50 rounds of z = 1 fit in epsilon 1";
  EXPECT_NE(stop->find("privacy budget"), std::string::npos) << *stop;
  EXPECT_LE(p->spent()->epsilon, 1.0);
}

TEST_F(RoundPrivacyTest, AFreshStartOverAnotherJobsLedgerIsRefused) {
  CoordinatorOptions o = Central();
  {
    auto p = RoundPrivacy::Open(&o, 0, 0);
    ASSERT_TRUE(p.ok()) << p.status();
    aggregation::StreamingAggregator agg = Aggregator();
    PrivateRound round;
    ASSERT_TRUE(p->Configure(1, &round, &agg).ok());
    RoundMetrics metrics;
    TensorList mean;
    ASSERT_TRUE(p->Release(round, 0, &agg, nullptr, &metrics, &mean).ok());
  }
  EXPECT_FALSE(RoundPrivacy::Open(&o, 0, 0).ok());
  o.resume = true;
  auto resumed = RoundPrivacy::Open(&o, 0, 1);
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  ASSERT_TRUE(resumed->spent().has_value());  // the ledger's entries, from the start
}

}  // namespace
}  // namespace huddle::coordinator
