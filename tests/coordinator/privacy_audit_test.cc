// An empirical privacy audit of client-level central DP, end to end through the real coordinator:
// many cheap one-round jobs with and without a canary client whose update is the worst case (norm
// C along one coordinate), and the simplest attack on the released model (threshold its first
// coordinate, knowing everything else). A mechanism that is (epsilon, delta)-DP forces every test
// to TPR <= e^epsilon * FPR + delta, so the attack's measured advantage, turned into a lower
// bound on epsilon with Clopper-Pearson intervals, must stay below the epsilon the coordinator
// states for the run. The same attack against a release with 8x less noise than the accounting
// assumes must break that bound: the audit has the power to notice an under-noised mechanism.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>

#include "coordinator/coordinator.h"
#include "tests/coordinator/fake_federation.h"

namespace huddle::coordinator {
namespace {

using testing::Behaviour;
using testing::FakeFederation;
using testing::ManualClock;
using testing::SyntheticClient;

constexpr int kHonest = 4;

// log of the binomial probability P(X = k), X ~ Bin(n, p).
double LogBinomial(int n, int k, double p) {
  return std::lgamma(n + 1.0) - std::lgamma(k + 1.0) - std::lgamma(n - k + 1.0) + k * std::log(p) +
         (n - k) * std::log1p(-p);
}
// P(X <= k) and P(X >= k).
double CdfAtMost(int n, int k, double p) {
  double s = 0;
  for (int i = 0; i <= k; ++i) s += std::exp(LogBinomial(n, i, p));
  return std::min(1.0, s);
}
double CdfAtLeast(int n, int k, double p) {
  double s = 0;
  for (int i = k; i <= n; ++i) s += std::exp(LogBinomial(n, i, p));
  return std::min(1.0, s);
}
// One-sided Clopper-Pearson bounds at confidence 1 - alpha (bisection).
double UpperBound(int n, int k, double alpha) {
  if (k == n) return 1;
  double lo = static_cast<double>(k) / n, hi = 1;
  for (int i = 0; i < 100; ++i) {
    const double mid = (lo + hi) / 2;
    (CdfAtMost(n, k, mid) > alpha ? lo : hi) = mid;
  }
  return hi;
}
double LowerBound(int n, int k, double alpha) {
  if (k == 0) return 0;
  double lo = 0, hi = static_cast<double>(k) / n;
  for (int i = 0; i < 100; ++i) {
    const double mid = (lo + hi) / 2;
    (CdfAtLeast(n, k, mid) > alpha ? hi : lo) = mid;
  }
  return lo;
}

class PrivacyAuditTest : public ::testing::Test {
 protected:
  CoordinatorOptions Options(double z, const std::string& dir) const {
    CoordinatorOptions o;
    o.job_name = "audit";
    o.seed = 3;
    o.rounds = 1;
    o.model = models::MlpSpec{6, {5}, 3};
    o.cohort.sampling = CohortOptions::Sampling::kPoisson;
    o.cohort.rate = 1.0;  // no sampling: the analytic Gaussian accountant is exact
    o.min_clients = kHonest;
    o.round_deadline_ms = 60'000;
    o.client_timeout_ms = 0;
    o.eval_every = 0;
    o.privacy.mode = privacy::PrivacyMode::kCentral;
    o.privacy.clip_norm = 1.0;
    o.privacy.delta = 1e-5;
    o.privacy.expected_cohort_size = kHonest + 1;  // fixed: the same with or without the canary
    privacy::ScheduleRange all;
    all.first_round = all.last_round = 1;
    all.noise_multiplier = z;
    o.privacy.schedule = {all};
    o.out_dir = dir;
    return o;
  }

  // One job; the released model's first coordinate minus its value without the canary and
  // without noise, in units of the noise std on the mean (so ~N(0,1) without the canary and
  // ~N(1/z_noise, 1) with it). `z_noise` is what the coordinator adds; epsilon_stated receives
  // what it reports for its own accounting of `z_noise`.
  double Statistic(bool canary, double z_noise, double* epsilon_stated) {
    const std::string dir = (base_ / std::to_string(runs_++)).string();
    CoordinatorOptions o = Options(z_noise, dir);
    std::vector<SyntheticClient> clients;
    for (int i = 0; i < kHonest; ++i) clients.push_back({"h" + std::to_string(i)});
    if (canary) clients.push_back({"canary", Behaviour::kCanary});
    ManualClock clock;
    FakeFederation fed(clients, models::Layout(o.model), &clock, 1);
    std::optional<double> epsilon;
    Coordinator coord(o, &fed, &clock, {}, [&](const RoundMetrics& m) {
      if (m.privacy) epsilon = m.privacy->epsilon;
    });
    EXPECT_TRUE(coord.Run().ok());
    std::filesystem::remove_all(dir);
    if (epsilon_stated != nullptr && epsilon) *epsilon_stated = *epsilon;
    // The attacker knows the initial model and every honest update.
    const TensorList init = models::InitModel(o.model, DeriveSeed(o.seed, 0x696e6974));
    double honest = 0;
    for (int i = 0; i < kHonest; ++i) {
      honest +=
          testing::HonestDelta(models::Layout(o.model), 1, "h" + std::to_string(i))[0].data[0];
    }
    const double mean_noise_std = z_noise * 1.0 / (kHonest + 1);
    const double released = coord.model()[0].data[0];
    return (released - init[0].data[0] - honest / (kHonest + 1)) / mean_noise_std;
  }

  struct Audit {
    double epsilon_lower_bound = 0;  // at confidence 1 - alpha for every threshold together
    double threshold = 0;
  };
  // Lower bound on epsilon from n runs per world, over a few thresholds chosen in advance.
  Audit Run(int n, double z_noise, double* epsilon_stated) {
    std::vector<double> with, without;
    for (int i = 0; i < n; ++i) {
      with.push_back(Statistic(true, z_noise, epsilon_stated));
      without.push_back(Statistic(false, z_noise, nullptr));
    }
    // Each of the 2 x 8 bounds fails with probability <= 1e-7: a false alarm (the honest run
    // "exceeding" its epsilon) has probability below 2e-6.
    constexpr double kAlpha = 1e-7;
    Audit best;
    for (double t : {0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0}) {
      const int tp = static_cast<int>(
          std::count_if(with.begin(), with.end(), [&](double s) { return s > t; }));
      const int fp = static_cast<int>(
          std::count_if(without.begin(), without.end(), [&](double s) { return s > t; }));
      const double tpr = LowerBound(n, tp, kAlpha);
      const double fpr = UpperBound(n, fp, kAlpha);
      const double eps = tpr > 1e-5 ? std::log((tpr - 1e-5) / fpr) : 0;
      if (eps > best.epsilon_lower_bound) best = {eps, t};
    }
    return best;
  }

  void SetUp() override {
    // Every job fsyncs its ledger and checkpoint: on a RAM file system where there is one.
    const std::filesystem::path tmp =
        std::filesystem::is_directory("/dev/shm") ? "/dev/shm" : ::testing::TempDir();
    base_ = tmp / ("huddle_privacy_audit_" + std::to_string(::getpid()));
    std::filesystem::remove_all(base_);
    std::filesystem::create_directories(base_);
  }
  void TearDown() override { std::filesystem::remove_all(base_); }

  std::filesystem::path base_;
  int runs_ = 0;
};

TEST_F(PrivacyAuditTest, TheCanaryAttackStaysWithinTheStatedEpsilonAndCatchesTooLittleNoise) {
  // z = 2: one release of the Gaussian mechanism, stated epsilon ~2.2 at delta 1e-5.
  double stated = 0;
  const Audit honest = Run(2000, 2.0, &stated);
  std::cout << "stated epsilon " << stated << " at delta 1e-5; audit lower bound "
            << honest.epsilon_lower_bound << " (threshold " << honest.threshold << ")\n";
  EXPECT_GT(stated, 1.5);
  EXPECT_LE(honest.epsilon_lower_bound, stated);
  // The same stated epsilon, with 8x less noise actually added: the audit refutes the claim.
  const Audit broken = Run(2000, 2.0 / 8, nullptr);
  std::cout << "with 8x less noise than stated: audit lower bound " << broken.epsilon_lower_bound
            << "\n";
  EXPECT_GT(broken.epsilon_lower_bound, stated);
}

}  // namespace
}  // namespace huddle::coordinator
