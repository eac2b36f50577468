// Distributed DP's accounting: Kairouz, Liu and Steinke 2021's bound for a sum of discrete
// Gaussians (tau, the RDP curve), its events through the accountants, the ledger and the plan.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "privacy/accountant.h"
#include "privacy/budget.h"
#include "privacy/distributed.h"
#include "privacy/ledger.h"

namespace huddle::privacy {
namespace {

DpEvent Distributed(double z, double tau, int64_t d, int64_t steps = 1) {
  DpEvent e{1.0, z, steps};
  e.mechanism = Mechanism::kDistributedDiscreteGaussian;
  e.tau = tau;
  e.dimension = d;
  return e;
}

TEST(DistributedDpTest, TauIsThePaperSum) {
  // tau = 10 sum_{k=1}^{n-1} exp(-2 pi^2 s k / (k + 1)).
  EXPECT_EQ(DistributedDiscreteGaussianTau(1, 1), 0);  // one share is one discrete Gaussian
  const double pi2 = M_PI * M_PI;
  EXPECT_NEAR(DistributedDiscreteGaussianTau(1, 2), 10 * std::exp(-pi2), 1e-15);
  EXPECT_NEAR(DistributedDiscreteGaussianTau(0.5, 3),
              10 * (std::exp(-pi2 / 2) + std::exp(-2 * pi2 / 3)), 1e-12);
  // Rounded up, never down.
  EXPECT_GE(DistributedDiscreteGaussianTau(1, 2), 10 * std::exp(-pi2));
  // Beyond variance ~76 every term underflows: each counts as the smallest subnormal.
  const double tiny = DistributedDiscreteGaussianTau(1e6, 1000);
  EXPECT_GT(tiny, 0);
  EXPECT_LT(tiny, 1e-316);
  EXPECT_TRUE(std::isnan(DistributedDiscreteGaussianTau(0.2, 10)));  // outside the theorem
  EXPECT_TRUE(std::isnan(DistributedDiscreteGaussianTau(1, 0)));
}

TEST(DistributedDpTest, RdpIsTheSmallerOfTheTwoBounds) {
  // z = 2 (l2 scale 1/2), tau = 0.01, d = 100, alpha = 2:
  // min(2 / 8 + 0.01 * 100, 2 / 2 (0.5 + 0.01 * 10)^2) = min(1.25, 0.36).
  EXPECT_NEAR(DistributedDiscreteGaussianRdp(2, 0.01, 100, 2), 0.36, 1e-15);
  // A tiny tau in one dimension: the first bound, alpha / (2 z^2) + tau d = 1 + 1e-9 (the
  // second is 4 (1/2 + 1e-9)^2 = 1 + 4e-9).
  EXPECT_NEAR(DistributedDiscreteGaussianRdp(2, 1e-9, 1, 8), 1.0 + 1e-9, 1e-15);
  // tau = 0: the Gaussian's curve, at every order.
  for (double alpha : DefaultRdpOrders()) {
    EXPECT_DOUBLE_EQ(DistributedDiscreteGaussianRdp(1.3, 0, 5000, alpha), alpha / (2 * 1.3 * 1.3));
  }
  EXPECT_EQ(DistributedDiscreteGaussianRdp(0, 0, 10, 2), std::numeric_limits<double>::infinity());
}

TEST(DistributedDpTest, WithTauZeroItSpendsWhatTheUnsampledGaussianSpendsUnderRdp) {
  const std::vector<DpEvent> gaussian = {{1.0, 4.0, 60}};
  const std::vector<DpEvent> distributed = {Distributed(4.0, 0, 50890, 60)};
  auto g = ComputeEpsilon(gaussian, 1e-4, AccountantKind::kRdp);
  auto d = ComputeSpend(distributed, 1e-4, AccountantKind::kRdp);
  ASSERT_TRUE(g.ok() && d.ok()) << d.status();
  EXPECT_EQ(d->accountant, AccountantKind::kRdp);  // never the analytic Gaussian
  EXPECT_DOUBLE_EQ(d->epsilon, g->epsilon);
  // The analytic accountant, exact for the Gaussian, is tighter: RDP is what the bound allows.
  auto exact = ComputeSpend(gaussian, 1e-4, AccountantKind::kRdp);
  ASSERT_TRUE(exact.ok());
  EXPECT_EQ(exact->accountant, AccountantKind::kAnalytic);
  EXPECT_LT(exact->epsilon, d->epsilon);
}

TEST(DistributedDpTest, TauCostsPrivacy) {
  auto none =
      ComputeSpend(std::vector<DpEvent>{Distributed(4.0, 0, 1000, 10)}, 1e-5, AccountantKind::kRdp);
  auto some = ComputeSpend(std::vector<DpEvent>{Distributed(4.0, 1e-4, 1000, 10)}, 1e-5,
                           AccountantKind::kRdp);
  ASSERT_TRUE(none.ok() && some.ok());
  EXPECT_GT(some->epsilon, none->epsilon);
}

TEST(DistributedDpTest, OnlyTheRdpAccountantAndOnlyUnsampled) {
  const std::vector<DpEvent> events = {Distributed(2.0, 0, 10)};
  for (AccountantKind kind : {AccountantKind::kPld, AccountantKind::kAnalytic}) {
    auto s = ComputeEpsilon(events, 1e-5, kind);
    EXPECT_EQ(s.status().code(), absl::StatusCode::kFailedPrecondition) << AccountantName(kind);
    EXPECT_NE(s.status().message().find("rdp"), std::string::npos) << s.status();
  }
  DpEvent sampled = Distributed(2.0, 0, 10);
  sampled.sampling_rate = 0.1;
  EXPECT_EQ(
      ComputeEpsilon(std::vector<DpEvent>{sampled}, 1e-5, AccountantKind::kRdp).status().code(),
      absl::StatusCode::kInvalidArgument);
  for (DpEvent bad : {Distributed(2.0, -1, 10), Distributed(2.0, NAN, 10),
                      Distributed(2.0, INFINITY, 10), Distributed(2.0, 0, 0)}) {
    EXPECT_EQ(ComputeEpsilon(std::vector<DpEvent>{bad}, 1e-5, AccountantKind::kRdp).status().code(),
              absl::StatusCode::kInvalidArgument);
  }
}

LedgerEntry DistributedEntry() {
  LedgerEntry e;
  e.round = 3;
  e.mechanism = kMechanismDistributed;
  e.sampling_rate = 1;
  e.noise_multiplier = 8.25;
  e.clip_norm = 1;
  e.mode = "distributed";
  e.noise = "client-side (secure aggregation shares)";
  e.adjacency = kReplaceOne;
  e.tau = 1e-300;
  e.dimension = 50890;
  return e;
}

// The one release formula the coordinator and each client's guard share: the sum's event as
// DistributedDiscreteGaussianEvent computes it, in the entry both wrote before, byte for byte.
TEST(DistributedDpTest, ReleaseIsTheSumsEventInTheRoundsEntry) {
  const DistributedShares shares{40, 12, 1024.0 + std::sqrt(50890.0), 50890};
  LedgerEntry e = DistributedRelease(3, shares, 1.0, kNoiseSecAggShares);
  const DpEvent sum = DistributedDiscreteGaussianEvent(40, 12, shares.sensitivity, 50890);
  EXPECT_EQ(e.noise_multiplier, sum.noise_multiplier);
  EXPECT_EQ(e.tau, sum.tau);
  EXPECT_EQ(e.dimension, 50890);
  e.noise_multiplier = 8.25;  // a value with a short decimal form, for the line below
  e.tau = 1e-300;
  e.job = "mnist";
  EXPECT_EQ(LedgerLine(e),
            R"j({"round":3,"mechanism":"distributed_discrete_gaussian","sampling_rate":1.0,)j"
            R"j("noise_multiplier":8.25,"clip_norm":1.0,"mode":"distributed","steps":1,)j"
            R"j("noise":"client-side (secure aggregation shares)","unit":"client",)j"
            R"j("adjacency":"replace_one","tau":1e-300,"dimension":50890,"job":"mnist"})j");
  EXPECT_EQ(LedgerLine(e), [&] {
    LedgerEntry by_hand = DistributedEntry();
    by_hand.job = "mnist";
    return LedgerLine(by_hand);
  }());
}

TEST(DistributedDpTest, LedgerLinesKeepTauAndDimension) {
  const LedgerEntry e = DistributedEntry();
  auto back = ParseLedgerLine(LedgerLine(e));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->mechanism, kMechanismDistributed);
  EXPECT_EQ(back->tau, 1e-300);
  EXPECT_EQ(back->dimension, 50890);
  const DpEvent event = back->event();
  EXPECT_EQ(event.mechanism, Mechanism::kDistributedDiscreteGaussian);
  EXPECT_EQ(event.noise_multiplier, 8.25 / 2);  // replace-one
  EXPECT_EQ(event.tau, 1e-300);
  EXPECT_EQ(event.dimension, 50890);
  // Entries merge only with the same mechanism, tau and dimension.
  LedgerEntry other = e;
  other.tau = 0;
  const std::vector<LedgerEntry> entries = {e, e, other};
  const std::vector<DpEvent> events = EventsOf(entries);
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0].steps, 2);

  // A distributed line without its tau or dimension, or sampled, cannot be accounted.
  for (const char* bad :
       {R"({"round":1,"mechanism":"distributed_discrete_gaussian","sampling_rate":1,)"
        R"("noise_multiplier":2,"clip_norm":1,"mode":"distributed","steps":1,"noise":"x",)"
        R"("adjacency":"replace_one","dimension":10})",
        R"({"round":1,"mechanism":"distributed_discrete_gaussian","sampling_rate":1,)"
        R"("noise_multiplier":2,"clip_norm":1,"mode":"distributed","steps":1,"noise":"x",)"
        R"("adjacency":"replace_one","tau":0})",
        R"({"round":1,"mechanism":"distributed_discrete_gaussian","sampling_rate":0.5,)"
        R"("noise_multiplier":2,"clip_norm":1,"mode":"distributed","steps":1,"noise":"x",)"
        R"("adjacency":"add_remove","tau":0,"dimension":10})"}) {
    EXPECT_EQ(ParseLedgerLine(bad).status().code(), absl::StatusCode::kDataLoss) << bad;
  }
}

TEST(DistributedDpTest, ThePlanCalibratesUnderReplaceOneWithRdp) {
  PrivacyOptions o;
  o.mode = PrivacyMode::kDistributed;
  o.total_epsilon = 8;
  o.delta = 1e-4;
  auto plan = PrivacyPlan::Create(o, 0.1, 60);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->accounting_rate(), 1.0);  // the coordinator knows the cohort
  EXPECT_STREQ(plan->adjacency(), kReplaceOne);
  const double z = plan->ForRound(1).noise_multiplier;
  auto add_remove = CalibrateNoiseMultiplier(8, 1e-4, 1.0, 60, AccountantKind::kRdp);
  ASSERT_TRUE(add_remove.ok());
  EXPECT_DOUBLE_EQ(z, 2 * *add_remove);
  const DpEvent event = plan->RoundEvent(z);
  EXPECT_EQ(event.mechanism, Mechanism::kDistributedDiscreteGaussian);
  EXPECT_EQ(event.noise_multiplier, z / 2);
  std::vector<DpEvent> events(60, event);
  auto spent = plan->Spent(events);
  ASSERT_TRUE(spent.ok()) << spent.status();
  EXPECT_LE(spent->epsilon, 8.0);
  EXPECT_GT(spent->epsilon, 8.0 * 0.999);
  // A round whose actual tau is positive is checked against the total as it is.
  auto would = plan->WouldSpendEvent(std::vector<DpEvent>(59, event), Distributed(z / 2, 1, 100));
  ASSERT_TRUE(would.ok());
  EXPECT_TRUE(would->second);

  o.accountant = AccountantKind::kPld;
  auto pld = PrivacyPlan::Create(o, 0.1, 60);
  EXPECT_EQ(pld.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(pld.status().message().find("rdp"), std::string::npos) << pld.status();
  o.accountant = AccountantKind::kRdp;
  o.adaptive.enabled = true;
  auto adaptive = PrivacyPlan::Create(o, 0.1, 60);
  EXPECT_EQ(adaptive.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace huddle::privacy
