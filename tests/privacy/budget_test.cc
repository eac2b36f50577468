#include "privacy/budget.h"

#include <gtest/gtest.h>

#include <cmath>

namespace huddle::privacy {
namespace {

PrivacyOptions Central(double epsilon, double delta) {
  PrivacyOptions o;
  o.mode = PrivacyMode::kCentral;
  o.total_epsilon = epsilon;
  o.delta = delta;
  return o;
}

std::vector<DpEvent> Rounds(const PrivacyPlan& plan, int64_t n) {
  std::vector<DpEvent> events;
  for (int64_t r = 1; r <= n; ++r) {
    events.push_back(
        {plan.accounting_rate(), plan.ForRound(static_cast<uint64_t>(r)).noise_multiplier, 1});
  }
  return events;
}

TEST(PrivacyPlanTest, TotalBudgetCalibratesNoiseSoAllRoundsFit) {
  auto plan = PrivacyPlan::Create(Central(8.0, 1e-4), 0.1, 50);
  ASSERT_TRUE(plan.ok()) << plan.status();
  const double z = plan->ForRound(1).noise_multiplier;
  EXPECT_GT(z, 0.3);
  EXPECT_EQ(plan->ForRound(50).noise_multiplier, z);
  auto all = plan->Spent(Rounds(*plan, 50));
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_LE(all->epsilon, 8.0);
  EXPECT_GT(all->epsilon, 8.0 * 0.99);  // calibration within 1% of the target
  // Every round up to the last fits; one more would not.
  auto last = plan->WouldSpend(Rounds(*plan, 49), 50);
  ASSERT_TRUE(last.ok());
  EXPECT_FALSE(last->second);
  auto extra = plan->WouldSpend(Rounds(*plan, 50), 50);
  ASSERT_TRUE(extra.ok());
  EXPECT_TRUE(extra->second);
}

TEST(PrivacyPlanTest, ScheduleWithNoiseAndPerRoundEpsilon) {
  PrivacyOptions o;
  o.mode = PrivacyMode::kCentral;
  o.delta = 1e-5;
  o.clip_norm = 0.5;
  ScheduleRange a;
  a.first_round = 1;
  a.last_round = 3;
  a.noise_multiplier = 1.5;
  ScheduleRange b;
  b.first_round = 4;
  b.last_round = 5;
  b.epsilon = 0.5;
  b.clip_norm = 0.25;
  o.schedule = {a, b};
  auto plan = PrivacyPlan::Create(o, 0.2, 5);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->ForRound(2).noise_multiplier, 1.5);
  EXPECT_EQ(plan->ForRound(2).clip_norm, 0.5);
  EXPECT_EQ(plan->ForRound(4).clip_norm, 0.25);
  // The per-round epsilon is met by the calibrated multiplier for one step.
  auto one = plan->Spent({{0.2, plan->ForRound(4).noise_multiplier, 1}});
  ASSERT_TRUE(one.ok());
  EXPECT_LE(one->epsilon, 0.5);
  EXPECT_GT(one->epsilon, 0.5 * 0.99);
}

TEST(PrivacyPlanTest, ScheduleMustCoverEveryRoundOnce) {
  PrivacyOptions o;
  o.mode = PrivacyMode::kCentral;
  ScheduleRange a;
  a.first_round = 1;
  a.last_round = 3;
  a.noise_multiplier = 1.0;
  o.schedule = {a};
  auto gap = PrivacyPlan::Create(o, 0.1, 4);
  ASSERT_FALSE(gap.ok());
  EXPECT_NE(gap.status().message().find("round 4"), absl::string_view::npos) << gap.status();
  o.schedule = {a, a};
  auto overlap = PrivacyPlan::Create(o, 0.1, 3);
  ASSERT_FALSE(overlap.ok());
  EXPECT_NE(overlap.status().message().find("already covered"), absl::string_view::npos);
  ScheduleRange both = a;
  both.epsilon = 1.0;
  o.schedule = {both};
  EXPECT_FALSE(PrivacyPlan::Create(o, 0.1, 3).ok());
}

TEST(PrivacyPlanTest, ScheduleCappedByTotalStopsEarly) {
  PrivacyOptions o = Central(6.0, 1e-5);
  ScheduleRange a;
  a.first_round = 1;
  a.last_round = 100;
  a.noise_multiplier = 0.8;
  o.schedule = {a};
  auto plan = PrivacyPlan::Create(o, 0.1, 100);
  ASSERT_TRUE(plan.ok()) << plan.status();
  int64_t ran = 0;
  std::vector<DpEvent> events;
  for (uint64_t r = 1; r <= 100; ++r) {
    auto w = plan->WouldSpend(events, r);
    ASSERT_TRUE(w.ok());
    if (w->second) break;
    events.push_back({0.1, 0.8, 1});
    ++ran;
  }
  EXPECT_GT(ran, 0);
  EXPECT_LT(ran, 100);
  auto spent = plan->Spent(events);
  ASSERT_TRUE(spent.ok());
  EXPECT_LE(spent->epsilon, 6.0);
}

TEST(PrivacyPlanTest, LocalModeAccountsEveryRoundWithoutSampling) {
  PrivacyOptions o = Central(4.0, 1e-5);
  o.mode = PrivacyMode::kLocal;
  auto plan = PrivacyPlan::Create(o, 0.1, 10);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->accounting_rate(), 1.0);
  auto spent = plan->Spent(Rounds(*plan, 10));
  ASSERT_TRUE(spent.ok());
  EXPECT_EQ(spent->accountant, AccountantKind::kAnalytic);
  EXPECT_LE(spent->epsilon, 4.0);
  EXPECT_GT(spent->epsilon, 4.0 * 0.99);
}

TEST(PrivacyPlanTest, RejectsBadOptions) {
  EXPECT_FALSE(PrivacyPlan::Create(Central(0, 1e-5), 0.1, 10).ok());
  EXPECT_FALSE(PrivacyPlan::Create(Central(1, 1.0), 0.1, 10).ok());
  EXPECT_FALSE(PrivacyPlan::Create(Central(1, 1e-5), 0.0, 10).ok());
  PrivacyOptions no_budget;
  no_budget.mode = PrivacyMode::kCentral;
  auto st = PrivacyPlan::Create(no_budget, 0.1, 10);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.status().message().find("privacy.epsilon"), absl::string_view::npos);
  PrivacyOptions bad_clip = Central(1, 1e-5);
  bad_clip.clip_norm = -1;
  EXPECT_FALSE(PrivacyPlan::Create(bad_clip, 0.1, 10).ok());
  PrivacyOptions none;
  EXPECT_TRUE(PrivacyPlan::Create(none, 0.1, 10).ok());  // mode none: nothing to check
}

TEST(AdaptiveClippingTest, ValueNoiseComposesToTheConfiguredMultiplier) {
  auto zv = ValueNoiseMultiplier(1.0, 5.0);
  ASSERT_TRUE(zv.ok());
  // 1/z^2 = 1/zv^2 + 1/(2 sigma_b)^2
  EXPECT_NEAR(1.0 / (*zv * *zv) + 1.0 / 100.0, 1.0, 1e-12);
  EXPECT_FALSE(ValueNoiseMultiplier(1.0, 0.5).ok());
}

}  // namespace
}  // namespace huddle::privacy
