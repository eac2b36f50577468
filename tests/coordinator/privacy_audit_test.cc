// An empirical privacy audit of client-level central DP, end to end through the real coordinator,
// with the power to catch a mechanism that adds HALF the noise std its accounting states.
//
// Each run is a one-round job (z = 2, C = 1, 4 honest clients, expected cohort 5, no sampling: the
// analytic Gaussian accounting is exact; stated epsilon 1.993 at delta 1e-5, i.e. mu = 1/z = 0.5)
// with or without a canary client whose update is the worst case (C along the first coordinate).
// The attacker knows the initial model and every honest update, so each released coordinate minus
// its noiseless value, divided by the std the accounting states for the mean (z C / 5), is the
// noise: N(0, 1) for a release that keeps its claim; the canary moves the first coordinate by
// 1/z = 0.5. 1,000 runs of each world feed the three checks of tests/privacy/audit_stats.h:
//   (a) a threshold attack on the first coordinate (threshold chosen on 500 runs of each world,
//       Clopper-Pearson bounds at 1e-7 on the other 500): its epsilon lower bound must stay <= the
//       stated epsilon. Shape-free, but blind to a factor 2 at any affordable number of runs (that
//       takes ~10^6): it reads 0 on the true mechanism and 0.53 at half the noise;
//   (b) the noise scale: 105,000 noise values (53 coordinates of each run without the canary, 52
//       of each with it) against the stated std, one-sided chi-square test at 1e-7 computed
//       exactly: a variance ratio below 0.977 rejects the claim. The true mechanism reads 1.002
//       (p 0.69), half the noise 0.252 (p 10^-14,373); a half-noise release passes it with
//       probability P(chi^2_105000 > 4 c) = 10^-35,261;
//   (c) the Gaussian privacy loss: mu = shift / std bounded below (normal bound on the shift,
//       chi-square bound on the std, 1e-7 each) and turned into the exact Gaussian epsilon, which
//       must stay <= the stated epsilon. True mechanism: 0.95. Half the noise doubles mu to 1
//       (epsilon 4.38); the bound reads 3.19 and stays at or below the stated 1.993 with
//       probability <= 1.6e-8 (GaussianLossMissProbability, asserted below).
// The true mechanism must pass all three: a false alarm has probability <= 5e-7 (the union of the
// 5 bounds, each wrong with probability <= 1e-7). The same audit of a coordinator that adds z/2
// (configured so: nothing in production code lets a coordinator add less noise than its ledger
// states) against the claim of z = 2 must be refuted by (b) AND by (c). Every job's noise comes
// from the production sampler keyed from the job's own seed (privacy.noise_seed), so these figures
// are the same on every run. 4,000 jobs: ~1.6 s.
//
// The second test audits one buffered asynchronous step the same way (participation-bounded
// accounting, replace-one: the canary's worlds are +C and -C; at z = 4 the stated mu is again
// 0.5), and refutes the same step with half the noise.
#include <gtest/gtest.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>

#include "coordinator/coordinator.h"
#include "tests/coordinator/fake_federation.h"
#include "tests/coordinator/run_job.h"
#include "tests/privacy/audit_expect.h"

namespace huddle::coordinator {
namespace {

using testing::Behaviour;
using testing::SyntheticClient;

constexpr int kHonest = 4;
constexpr int kRuns = 1000;  // per world
constexpr double kDelta = 1e-5;
constexpr double kZ = 2;  // the stated noise multiplier
// Asynchronous: replace-one doubles the shift (2C between the worlds), so z = 4 gives the same
// mu = 2 / z = 0.5, and the same statistics, as the synchronous audit.
constexpr double kAsyncZ = 4;

class PrivacyAuditTest : public ::testing::Test {
 protected:
  // `async`: one buffered asynchronous server step of all kHonest + 1 updates instead
  // (participation-bounded: unsampled, replace-one, the fixed denominator async.buffer).
  CoordinatorOptions Options(double z, uint64_t noise_seed, const std::string& dir,
                             bool async = false) const {
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
    o.privacy.delta = kDelta;
    o.privacy.expected_cohort_size = kHonest + 1;  // fixed: the same with or without the canary
    privacy::ScheduleRange all;
    all.first_round = all.last_round = 1;
    all.noise_multiplier = z;
    o.privacy.schedule = {all};
    // Reproducible: the same releases (and verdicts) on every run of the test; the sampler and
    // the key are the production ones, only the key is derived from the seed.
    o.privacy.noise_seed = noise_seed;
    o.out_dir = dir;
    if (async) {
      o.async.enabled = true;
      o.async.concurrency = o.async.buffer = kHonest + 1;
      o.privacy.expected_cohort_size.reset();  // the denominator is async.buffer
      o.privacy.max_participations = 1;
      o.min_clients = kHonest + 1;
    }
    return o;
  }

  // One job whose coordinator adds the noise of `z_noise`: the released model minus the initial
  // model and the honest clients' mean update, coordinate by coordinate, in units of the std that
  // z = kZ states for the mean (kZ C / (kHonest + 1)). epsilon_stated receives what the
  // coordinator reports for its own accounting.
  // `canary_value`: 0 for no canary (the synchronous audit's neighbour), else the canary's first
  // coordinate (the asynchronous audit's two worlds: +1 and -1, replace-one). The residuals are
  // against the honest clients' mean alone.
  std::vector<double> Residuals(float canary_value, double z_noise, double* epsilon_stated,
                                bool async = false) {
    const int run = runs_++;
    const std::string dir = (base_ / std::to_string(run)).string();
    CoordinatorOptions o = Options(z_noise, DeriveSeed(0x61756469, run), dir, async);
    std::vector<SyntheticClient> clients;
    for (int i = 0; i < kHonest; ++i) clients.push_back({"h" + std::to_string(i)});
    if (canary_value != 0) {
      clients.push_back({"canary", Behaviour::kCanary});
      clients.back().value = canary_value;
    }
    const testing::JobRun job = testing::RunJob(o, {.clients = std::move(clients)});
    EXPECT_TRUE(job.status.ok());
    std::optional<double> epsilon;
    for (const RoundMetrics& m : job.metrics) {
      if (m.privacy) epsilon = m.privacy->epsilon;
    }
    std::filesystem::remove_all(dir);
    if (epsilon_stated != nullptr && epsilon) *epsilon_stated = *epsilon;
    const ModelLayout layout = models::Layout(o.model);
    TensorList expected = models::InitModel(o.model, DeriveSeed(o.seed, 0x696e6974));
    std::vector<TensorList> honest;
    for (int i = 0; i < kHonest; ++i) {
      honest.push_back(testing::HonestDelta(layout, 1, "h" + std::to_string(i)));
    }
    const double stated_std = (async ? kAsyncZ : kZ) * 1.0 / (kHonest + 1);
    std::vector<double> out;
    for (size_t t = 0; t < expected.size(); ++t) {
      for (size_t i = 0; i < expected[t].data.size(); ++i) {
        double sum = 0;
        for (const TensorList& h : honest) sum += h[t].data[i];
        const double noiseless = expected[t].data[i] + sum / (kHonest + 1);
        out.push_back((job.model[t].data[i] - noiseless) / stated_std);
      }
    }
    return out;
  }

  // kRuns jobs of each world, the coordinator adding the noise of z_noise.
  testing::audit::Samples Run(double z_noise, double* epsilon_stated) {
    testing::audit::Samples s;
    for (int i = 0; i < kRuns; ++i) {
      const std::vector<double> with = Residuals(1, z_noise, epsilon_stated);
      const std::vector<double> without = Residuals(0, z_noise, nullptr);
      s.canary.push_back(with[0]);
      s.neighbour.push_back(without[0]);
      s.noise.insert(s.noise.end(), with.begin() + 1, with.end());  // the canary moves only [0]
      s.noise.insert(s.noise.end(), without.begin(), without.end());
    }
    return s;
  }

  // The asynchronous worlds: the canary's update +C or -C along the first coordinate.
  testing::audit::Samples RunAsync(double z_noise, double* epsilon_stated) {
    testing::audit::Samples s;
    for (int i = 0; i < kRuns; ++i) {
      const std::vector<double> plus = Residuals(1, z_noise, epsilon_stated, true);
      const std::vector<double> minus = Residuals(-1, z_noise, nullptr, true);
      s.canary.push_back(plus[0]);
      s.neighbour.push_back(minus[0]);
      s.noise.insert(s.noise.end(), plus.begin() + 1, plus.end());
      s.noise.insert(s.noise.end(), minus.begin() + 1, minus.end());
    }
    return s;
  }

  void SetUp() override {
    level_ = spdlog::get_level();
    // 4,000 jobs' routine logs, and each seeded job's warning that its noise is not private.
    spdlog::set_level(spdlog::level::err);
    // Every job fsyncs its ledger and checkpoint: on a RAM file system where there is one.
    const std::filesystem::path tmp =
        std::filesystem::is_directory("/dev/shm") ? "/dev/shm" : ::testing::TempDir();
    base_ = tmp / ("huddle_privacy_audit_" + std::to_string(::getpid()));
    std::filesystem::remove_all(base_);
    std::filesystem::create_directories(base_);
  }
  void TearDown() override {
    std::filesystem::remove_all(base_);
    spdlog::set_level(level_);
  }

  std::filesystem::path base_;
  int runs_ = 0;
  spdlog::level::level_enum level_ = spdlog::level::info;
};

TEST_F(PrivacyAuditTest, TheTrueMechanismPassesAndHalfTheStatedNoiseIsRefuted) {
  namespace audit = testing::audit;
  double stated = 0;
  const audit::Audit honest = audit::RunAudit(Run(kZ, &stated), kDelta);
  audit::Print(std::cout, "central DP, z = 2 added", honest, stated);
  // The coordinator's accounting of one unsampled release is the exact Gaussian epsilon of
  // mu = 1 / z.
  EXPECT_NEAR(stated, audit::GaussianEpsilon(1 / kZ, kDelta), 1e-6 * stated);
  audit::ExpectKeepsItsClaim(honest, stated, 0.03);

  // The same audit of a coordinator adding z / 2 against the claim of z: refuted twice over.
  const audit::Audit half = audit::RunAudit(Run(kZ / 2, nullptr), kDelta);
  audit::Print(std::cout, "central DP, z = 1 added, z = 2 claimed", half, stated);
  audit::ExpectRefutedAtHalfTheNoise(half, stated);

  // The design's miss probabilities at half the noise (mu = 2 / z in the actual std).
  const double miss_scale = std::exp(honest.scale.log_miss_at_half);
  const double miss_gaussian =
      audit::GaussianLossMissProbability(kRuns, kRuns, honest.scale.dof, 2 / kZ, stated, kDelta);
  std::cout << "false alarm <= " << audit::kFalseAlarm << "; at half the noise (b) misses w.p. 10^"
            << honest.scale.log_miss_at_half / std::log(10.0) << ", (c) w.p. <= " << miss_gaussian
            << "\n";
  EXPECT_LT(miss_scale, 1e-6);
  EXPECT_LT(miss_gaussian, 1e-6);
}

// The same audit of a buffered asynchronous step (participation-bounded accounting: one
// unsampled replace-one release; privacy/budget.h): the canary's two worlds are +C and -C, whose
// means differ by 2C / 5, against noise of std z C / 5 on each: mu = 2 / z = 0.5 at z = 4, the
// stated epsilon the exact Gaussian one of that mu. 4,000 jobs: ~2 s.
TEST_F(PrivacyAuditTest, AnAsynchronousStepKeepsItsClaimAndHalfTheNoiseIsRefuted) {
  namespace audit = testing::audit;
  double stated = 0;
  const audit::Audit honest = audit::RunAudit(RunAsync(kAsyncZ, &stated), kDelta);
  audit::Print(std::cout, "async central DP, z = 4 added", honest, stated);
  EXPECT_NEAR(stated, audit::GaussianEpsilon(2 / kAsyncZ, kDelta), 1e-6 * stated);
  audit::ExpectKeepsItsClaim(honest, stated, 0.03);
  const audit::Audit half = audit::RunAudit(RunAsync(kAsyncZ / 2, nullptr), kDelta);
  audit::Print(std::cout, "async central DP, z = 2 added, z = 4 claimed", half, stated);
  audit::ExpectRefutedAtHalfTheNoise(half, stated);
  const double miss_scale = std::exp(honest.scale.log_miss_at_half);
  const double miss_gaussian = audit::GaussianLossMissProbability(kRuns, kRuns, honest.scale.dof,
                                                                  2 / kAsyncZ * 2, stated, kDelta);
  std::cout << "at half the noise (b) misses w.p. 10^"
            << honest.scale.log_miss_at_half / std::log(10.0) << ", (c) w.p. <= " << miss_gaussian
            << "\n";
  EXPECT_LT(miss_scale, 1e-6);
  EXPECT_LT(miss_gaussian, 1e-6);
}

}  // namespace
}  // namespace huddle::coordinator
