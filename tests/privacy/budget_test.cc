#include "privacy/budget.h"

#include <gtest/gtest.h>

#include <cmath>

#include "privacy/ledger.h"

namespace huddle::privacy {
namespace {

PrivacyOptions Central(double epsilon, double delta) {
  PrivacyOptions o;
  o.mode = PrivacyMode::kCentral;
  o.total_epsilon = epsilon;
  o.delta = delta;
  o.expected_cohort_size = 10;
  return o;
}

std::vector<DpEvent> Rounds(const PrivacyPlan& plan, int64_t n) {
  std::vector<DpEvent> events;
  for (int64_t r = 1; r <= n; ++r) {
    events.push_back(plan.RoundEvent(plan.ForRound(static_cast<uint64_t>(r)).noise_multiplier));
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
  o.expected_cohort_size = 10;
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
  o.expected_cohort_size = 10;
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

// Local DP is replace-one: two clipped updates differ by up to 2C, so noise std z*C is the
// Gaussian mechanism with multiplier z / 2, and a budget calibrates z twice the add/remove value.
// (Accounted as add/remove, a 30-round job "at epsilon 8" is at 19.1 under replace-one.)
TEST(PrivacyPlanTest, LocalModeIsAccountedUnderReplaceOne) {
  PrivacyOptions o = Central(8.0, 1e-5);
  o.mode = PrivacyMode::kLocal;
  auto plan = PrivacyPlan::Create(o, 1.0, 30);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_STREQ(plan->adjacency(), kReplaceOne);
  const double z = plan->ForRound(1).noise_multiplier;
  auto add_remove = CalibrateNoiseMultiplier(8.0, 1e-5, 1.0, 30, AccountantKind::kAnalytic);
  ASSERT_TRUE(add_remove.ok());
  EXPECT_DOUBLE_EQ(z, 2 * *add_remove);
  EXPECT_EQ(plan->RoundEvent(z).noise_multiplier, z / 2);
  // The old accounting of the same noise: z as if the sensitivity were C.
  const std::vector<DpEvent> as_add_remove = {{1.0, *add_remove, 30}};
  const std::vector<DpEvent> as_replace_one = {{1.0, *add_remove / 2, 30}};
  auto claimed = ComputeEpsilon(as_add_remove, 1e-5, AccountantKind::kAnalytic);
  auto real = ComputeEpsilon(as_replace_one, 1e-5, AccountantKind::kAnalytic);
  ASSERT_TRUE(claimed.ok() && real.ok());
  EXPECT_NEAR(claimed->epsilon, 8.0, 0.08);
  EXPECT_NEAR(real->epsilon, 19.1, 0.1);
  auto spent = plan->Spent(Rounds(*plan, 30));
  ASSERT_TRUE(spent.ok());
  EXPECT_LE(spent->epsilon, 8.0);
  EXPECT_GT(spent->epsilon, 8.0 * 0.99);
}

TEST(PrivacyPlanTest, AdaptiveClippingInLocalModeAndAMissingDenominatorAreRefused) {
  PrivacyOptions local = Central(4.0, 1e-5);
  local.mode = PrivacyMode::kLocal;
  local.adaptive.enabled = true;
  auto st = PrivacyPlan::Create(local, 1.0, 10);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.status().message().find("adaptive_clipping"), absl::string_view::npos);
  PrivacyOptions central = Central(4.0, 1e-5);
  central.expected_cohort_size.reset();
  st = PrivacyPlan::Create(central, 0.1, 10);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.status().message().find("expected_cohort_size"), absl::string_view::npos);
  central.expected_cohort_size = 0.5;
  EXPECT_FALSE(PrivacyPlan::Create(central, 0.1, 10).ok());
}

TEST(PrivacyPlanTest, RejectsBadOptions) {
  EXPECT_FALSE(PrivacyPlan::Create(Central(0, 1e-5), 0.1, 10).ok());
  EXPECT_FALSE(PrivacyPlan::Create(Central(1, 1.0), 0.1, 10).ok());
  EXPECT_FALSE(PrivacyPlan::Create(Central(1, 1e-5), 0.0, 10).ok());
  PrivacyOptions no_budget;
  no_budget.mode = PrivacyMode::kCentral;
  no_budget.expected_cohort_size = 10;
  auto st = PrivacyPlan::Create(no_budget, 0.1, 10);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.status().message().find("privacy.epsilon"), absl::string_view::npos);
  PrivacyOptions bad_clip = Central(1, 1e-5);
  bad_clip.clip_norm = -1;
  EXPECT_FALSE(PrivacyPlan::Create(bad_clip, 0.1, 10).ok());
  PrivacyOptions none;
  EXPECT_TRUE(PrivacyPlan::Create(none, 0.1, 10).ok());  // mode none: nothing to check
}

// Participation-bounded accounting (asynchronous training): no sampling, replace-one, and a
// client's spend is at most that of the max_participations most expensive releases.
TEST(PrivacyPlanTest, ABoundedPlanAccountsTheWorstClientsReleasesOnly) {
  PrivacyOptions o;
  o.mode = PrivacyMode::kCentral;
  o.total_epsilon = 6.0;
  o.delta = 1e-5;
  o.max_participations = 4;
  auto plan = PrivacyPlan::Create(o, 0.01, 1000);  // the cohort rate is not used
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_TRUE(plan->bounded());
  EXPECT_EQ(plan->accounting_rate(), 1.0);
  EXPECT_STREQ(plan->adjacency(), kReplaceOne);
  // z is calibrated so that 4 releases (of z / 2) fit the total, not 1000.
  const double z = plan->ForRound(1).noise_multiplier;
  const auto four =
      ComputeEpsilon(std::vector{DpEvent{1.0, z / 2, 4}}, o.delta, AccountantKind::kAnalytic);
  ASSERT_TRUE(four.ok());
  EXPECT_LE(four->epsilon, 6.0);
  EXPECT_GT(four->epsilon, 6.0 * 0.99);
  // 1000 releases spend what 4 do, and all of them fit.
  const auto all = plan->Spent(Rounds(*plan, 1000));
  ASSERT_TRUE(all.ok());
  EXPECT_NEAR(all->epsilon, four->epsilon, 1e-9);
  const auto fit = plan->Fit();
  ASSERT_TRUE(fit.ok());
  EXPECT_TRUE(fit->fits);
  // The worst client's releases are the cheapest-noise ones: a release with half the noise
  // replaces one of the four, and a lost entry (z = 0) is unbounded.
  std::vector<DpEvent> events = Rounds(*plan, 10);
  events.push_back(plan->RoundEvent(z / 2));
  const std::vector<DpEvent> worst = plan->WorstParticipant(events);
  int64_t steps = 0;
  for (const DpEvent& e : worst) steps += e.steps;
  EXPECT_EQ(steps, 4);
  EXPECT_EQ(worst.front().noise_multiplier, z / 4);
  const auto more = plan->WouldSpendEvent(Rounds(*plan, 10), plan->RoundEvent(z / 2));
  ASSERT_TRUE(more.ok());
  EXPECT_TRUE(more->second);  // past the total: the stop rule ends the job before it
  events.push_back(DpEvent{1.0, 0, 1});
  const auto lost = plan->Spent(events);
  ASSERT_TRUE(lost.ok());
  EXPECT_TRUE(std::isinf(lost->epsilon));
  // A schedule whose releases do not fit says how many do.
  PrivacyOptions capped = o;
  ScheduleRange r;
  r.first_round = 1;
  r.last_round = 10;
  r.noise_multiplier = 2;
  capped.schedule = {r};
  capped.total_epsilon = 5.0;
  auto small = PrivacyPlan::Create(capped, 1, 10);
  ASSERT_TRUE(small.ok());
  const auto short_fit = small->Fit();
  ASSERT_TRUE(short_fit.ok());
  // Releases of z / 2 = 1 each: one is mu = 1 (epsilon 4.2 at 1e-5), two mu = 1.41 (past 5).
  EXPECT_FALSE(short_fit->fits);
  EXPECT_EQ(short_fit->rounds_that_fit, 1);
  ASSERT_TRUE(short_fit->noise_multiplier_that_fits.has_value());
  // Without a bound every release is every client's.
  o.max_participations.reset();
  o.expected_cohort_size = 10;
  auto unbounded = PrivacyPlan::Create(o, 1.0, 1000);
  ASSERT_TRUE(unbounded.ok());
  EXPECT_FALSE(unbounded->bounded());
  EXPECT_EQ(unbounded->WorstParticipant(Rounds(*unbounded, 10)).size(), 10u);
}

TEST(AdaptiveClippingTest, ValueNoiseComposesToTheConfiguredMultiplier) {
  auto zv = ValueNoiseMultiplier(1.0, 5.0);
  ASSERT_TRUE(zv.ok());
  // 1/z^2 = 1/zv^2 + 1/(2 sigma_b)^2
  EXPECT_NEAR(1.0 / (*zv * *zv) + 1.0 / 100.0, 1.0, 1e-12);
  EXPECT_FALSE(ValueNoiseMultiplier(1.0, 0.5).ok());
}

// One range of noise multiplier z over rounds [1, rounds].
PrivacyOptions Scheduled(PrivacyOptions o, double z, int64_t rounds) {
  ScheduleRange all;
  all.first_round = 1;
  all.last_round = rounds;
  all.noise_multiplier = z;
  o.schedule = {all};
  return o;
}

// The epsilon of `rounds` rounds of one z under `o` (its mode's adjacency and accounting).
double EpsilonOf(const PrivacyOptions& o, double q, double z, int64_t rounds) {
  auto plan = PrivacyPlan::Create(Scheduled(o, z, rounds), q, rounds);
  EXPECT_TRUE(plan.ok()) << plan.status();
  auto spent = plan->Spent(Rounds(*plan, rounds));
  EXPECT_TRUE(spent.ok()) << spent.status();
  return spent->epsilon;
}

TEST(BudgetFitTest, APlanPastItsBudgetGetsTheNoiseThatFitsAndTheStepsThatDo) {
  const std::vector<DpEvent> plan = {{0.5, 2.0, 10}, {0.5, 2.0, 30}};
  auto fit = FitBudget(plan, 3.0, 1e-5, AccountantKind::kRdp);
  ASSERT_TRUE(fit.ok()) << fit.status();
  EXPECT_FALSE(fit->fits);
  auto all = ComputeEpsilon(std::vector<DpEvent>{{0.5, 2.0, 40}}, 1e-5, AccountantKind::kRdp);
  ASSERT_TRUE(all.ok());
  EXPECT_DOUBLE_EQ(fit->spend.epsilon, all->epsilon);
  ASSERT_TRUE(fit->noise_multiplier_that_fits.has_value());
  auto z = CalibrateNoiseMultiplier(3.0, 1e-5, 0.5, 40, AccountantKind::kRdp);
  ASSERT_TRUE(z.ok());
  EXPECT_EQ(*fit->noise_multiplier_that_fits, *z);
  // The steps that fit: k spend at most the budget, k + 1 more.
  auto k = StepsWithinBudget(plan, 3.0, 1e-5, AccountantKind::kRdp);
  ASSERT_TRUE(k.ok()) << k.status();
  EXPECT_GT(*k, 0);
  EXPECT_LT(*k, 40);
  auto at = ComputeEpsilon(std::vector<DpEvent>{{0.5, 2.0, *k}}, 1e-5, AccountantKind::kRdp);
  auto past = ComputeEpsilon(std::vector<DpEvent>{{0.5, 2.0, *k + 1}}, 1e-5, AccountantKind::kRdp);
  ASSERT_TRUE(at.ok() && past.ok());
  EXPECT_LE(at->epsilon, 3.0);
  EXPECT_GT(past->epsilon, 3.0);
  // A plan within its budget fits whole.
  auto within = FitBudget(plan, 100.0, 1e-5, AccountantKind::kRdp);
  ASSERT_TRUE(within.ok());
  EXPECT_TRUE(within->fits);
  EXPECT_FALSE(within->noise_multiplier_that_fits.has_value());
  EXPECT_EQ(*StepsWithinBudget(plan, 100.0, 1e-5, AccountantKind::kRdp), 40);
  // Not even one step.
  EXPECT_EQ(*StepsWithinBudget(plan, 1e-3, 1e-5, AccountantKind::kRdp), 0);
}

// A capped schedule whose rounds cannot all run within the total (the stop rule would end it
// early): Fit names the rounds that fit, as the stop rule would run them, and one noise multiplier
// that fits them all.
TEST(PlanFitTest, ACappedScheduleThatDoesNotFitSaysWhatWould) {
  const PrivacyOptions o = Scheduled(Central(3.0, 1e-5), 2.0, 40);
  auto plan = PrivacyPlan::Create(o, 0.5, 40);
  ASSERT_TRUE(plan.ok()) << plan.status();
  auto fit = plan->Fit();
  ASSERT_TRUE(fit.ok()) << fit.status();
  EXPECT_FALSE(fit->fits);
  EXPECT_EQ(fit->rounds, 40);
  EXPECT_GT(fit->spend.epsilon, 3.0);
  // The rounds that fit are the rounds the stop rule runs.
  int64_t ran = 0;
  std::vector<DpEvent> events;
  for (uint64_t r = 1; r <= 40; ++r) {
    auto w = plan->WouldSpend(events, r);
    ASSERT_TRUE(w.ok());
    if (w->second) break;
    events.push_back(plan->RoundEvent(2.0));
    ++ran;
  }
  EXPECT_EQ(fit->rounds_that_fit, ran);
  ASSERT_TRUE(fit->noise_multiplier_that_fits.has_value());
  const double z = *fit->noise_multiplier_that_fits;
  EXPECT_GT(z, 2.0);
  EXPECT_LE(EpsilonOf(o, 0.5, z, 40), 3.0);
  EXPECT_GT(EpsilonOf(o, 0.5, z * 0.99, 40), 3.0) << "the smallest that fits, to 1%";
  const std::string text = fit->Shortfall();
  EXPECT_NE(text.find("privacy.epsilon: 40 rounds at noise_multiplier 2 spend epsilon "),
            std::string::npos)
      << text;
  EXPECT_NE(text.find(absl::StrCat(ran, " rounds fit (rounds: ", ran, ")")), std::string::npos)
      << text;
  EXPECT_NE(text.find("past the total 3"), std::string::npos) << text;
  EXPECT_NE(text.find(", or noise_multiplier >= "), std::string::npos) << text;
  // The printed z is rounded up, so that setting it fits.
  const size_t at = text.find(">= ") + 3;
  const double printed = std::stod(text.substr(at));
  EXPECT_GE(printed, z);
  EXPECT_LE(EpsilonOf(o, 0.5, printed, 40), 3.0);
  EXPECT_EQ(fit->schedule.size(), 1u);
  EXPECT_EQ(fit->schedule[0].last_round, 40);
  // So little noise that not one round fits.
  auto none = PrivacyPlan::Create(Scheduled(Central(3.0, 1e-5), 0.6, 40), 0.5, 40);
  ASSERT_TRUE(none.ok()) << none.status();
  auto nothing = none->Fit();
  ASSERT_TRUE(nothing.ok()) << nothing.status();
  EXPECT_EQ(nothing->rounds_that_fit, 0);
  EXPECT_NE(nothing->Shortfall().find(": not even round 1 fits; noise_multiplier >= "),
            std::string::npos)
      << nothing->Shortfall();
}

TEST(PlanFitTest, CalibratedAndUncappedPlansFitAndStateTheirSchedule) {
  auto calibrated = PrivacyPlan::Create(Central(8.0, 1e-4), 0.1, 50);
  ASSERT_TRUE(calibrated.ok());
  auto fit = calibrated->Fit();
  ASSERT_TRUE(fit.ok()) << fit.status();
  EXPECT_TRUE(fit->fits);
  EXPECT_EQ(fit->rounds_that_fit, 50);
  EXPECT_LE(fit->spend.epsilon, 8.0);
  EXPECT_EQ(fit->Shortfall(), "");
  // No total: nothing caps it, whatever it spends.
  PrivacyOptions uncapped = Scheduled(Central(1.0, 1e-5), 0.5, 40);
  uncapped.total_epsilon.reset();
  ScheduleRange later;
  later.first_round = 21;
  later.last_round = 40;
  later.noise_multiplier = 1.0;
  later.clip_norm = 0.5;
  uncapped.schedule[0].last_round = 20;
  uncapped.schedule.push_back(later);
  auto plan = PrivacyPlan::Create(uncapped, 0.5, 40);
  ASSERT_TRUE(plan.ok()) << plan.status();
  auto open = plan->Fit();
  ASSERT_TRUE(open.ok());
  EXPECT_TRUE(open->fits);
  EXPECT_GT(open->spend.epsilon, 1.0);
  const std::vector<PlannedRange> schedule = plan->Schedule();
  ASSERT_EQ(schedule.size(), 2u);
  EXPECT_EQ(schedule[0].first_round, 1);
  EXPECT_EQ(schedule[0].last_round, 20);
  EXPECT_EQ(schedule[0].noise_multiplier, 0.5);
  EXPECT_EQ(schedule[1].first_round, 21);
  EXPECT_EQ(schedule[1].clip_norm, 0.5);
  // The planned events are the rounds' own, merged into runs.
  const std::vector<DpEvent> events = plan->PlannedEvents(25);
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0].steps, 20);
  EXPECT_EQ(events[1].steps, 5);
  auto merged = plan->Spent(events);
  auto each = plan->Spent(Rounds(*plan, 25));
  ASSERT_TRUE(merged.ok() && each.ok());
  EXPECT_NEAR(merged->epsilon, each->epsilon, 1e-9 * each->epsilon);
}

// Local DP is replace-one: the z that fits is the configured noise, twice the accountant's.
TEST(PlanFitTest, TheNoiseThatFitsALocalPlanIsTheConfiguredOne) {
  PrivacyOptions o = Scheduled(Central(4.0, 1e-5), 3.0, 20);
  o.mode = PrivacyMode::kLocal;
  auto plan = PrivacyPlan::Create(o, 1.0, 20);
  ASSERT_TRUE(plan.ok()) << plan.status();
  auto fit = plan->Fit();
  ASSERT_TRUE(fit.ok()) << fit.status();
  ASSERT_FALSE(fit->fits);
  ASSERT_TRUE(fit->noise_multiplier_that_fits.has_value());
  const double z = *fit->noise_multiplier_that_fits;
  EXPECT_LE(EpsilonOf(o, 1.0, z, 20), 4.0);
  EXPECT_GT(EpsilonOf(o, 1.0, z * 0.99, 20), 4.0);
  EXPECT_GT(fit->rounds_that_fit, 0);
  EXPECT_LE(EpsilonOf(o, 1.0, 3.0, fit->rounds_that_fit), 4.0);
  EXPECT_GT(EpsilonOf(o, 1.0, 3.0, fit->rounds_that_fit + 1), 4.0);
}

TEST(MeanNoiseTest, TheNoiseOnTheMeanPerModeAsAMultipleOfTheClipNorm) {
  // One draw of std z*C on the sum, divided by the n updates (central, distributed) ...
  EXPECT_DOUBLE_EQ(MeanNoiseToClip(PrivacyMode::kCentral, 4.5, 1.5), 3.0);
  EXPECT_DOUBLE_EQ(MeanNoiseToClip(PrivacyMode::kDistributed, 1.0, 100), 0.01);
  // ... or n independent draws of std z*C, averaged (local).
  EXPECT_DOUBLE_EQ(MeanNoiseToClip(PrivacyMode::kLocal, 4.0, 4), 2.0);
  EXPECT_EQ(MeanNoiseToClip(PrivacyMode::kNone, 4.0, 4), 0);
}

}  // namespace
}  // namespace huddle::privacy
