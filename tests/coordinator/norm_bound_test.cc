// Norm-bounded aggregation by default (issue 32): the automatic bound (UpdateNormBound) and a
// federation where one client sends +1000 in every value.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "coordinator/coordinator.h"
#include "coordinator/update_check.h"
#include "tests/coordinator/fake_federation.h"
#include "tests/coordinator/run_job.h"
#include "tests/testing/tensors.h"

namespace huddle::coordinator {
namespace {

using testing::Behaviour;
using testing::MaxAbsDiff;
using testing::SyntheticClient;

TEST(UpdateNormBoundTest, AFixedBoundIsThatBoundAndOffIsNone) {
  UpdateNormBound fixed(5, 3);
  EXPECT_TRUE(fixed.enabled());
  EXPECT_EQ(fixed.BoundFor(1, 100), 5);
  UpdateNormBound off(0, 0);
  EXPECT_FALSE(off.enabled());
  off.Accepted(1, 1);
  off.Accepted(1, 1);
  EXPECT_EQ(off.BoundFor(1, 100), 0);
  EXPECT_EQ(off.BoundFor(2, 100), 0);
}

TEST(UpdateNormBoundTest, RoundOneClipsOnceThreeNormsAreKnown) {
  UpdateNormBound b(0, 3);
  EXPECT_EQ(b.BoundFor(1, 1000), 0) << "the first update of a round without history";
  b.Accepted(1, 1000);
  EXPECT_EQ(b.BoundFor(1, 2), 0) << "two known";
  b.Accepted(1, 2);
  // Known: 1000, 2 and this 4: the median is 4.
  EXPECT_DOUBLE_EQ(b.BoundFor(1, 4), 12);
  b.Accepted(1, 4);
  // Known: 1000, 2, 4 and this 3: the lower median is 3.
  EXPECT_DOUBLE_EQ(b.BoundFor(1, 3), 9);
  b.Accepted(1, 3);
  // Round 2: the median of round 1's accepted norms {2, 3, 4, 1000} (lower: 3), whatever the
  // update's own norm.
  EXPECT_DOUBLE_EQ(b.BoundFor(2, 1e6), 9);
  b.Accepted(2, 1e6);
  EXPECT_DOUBLE_EQ(b.BoundFor(2, 1), 9) << "this round's norms join the history after it";
  // Zero and non-finite norms are not recorded.
  UpdateNormBound z(0, 2);
  z.Accepted(1, 0);
  z.Accepted(1, NAN);
  z.Accepted(1, 1);
  EXPECT_EQ(z.BoundFor(1, 1), 0);
}

TEST(UpdateNormBoundTest, TheHistoryIsTheLastWindowOfNorms) {
  UpdateNormBound b(0, 2);
  // Round 1: kWindow norms of 100; round 2: kWindow norms of 1; round 3 sees only round 2's.
  for (size_t i = 0; i < UpdateNormBound::kWindow; ++i) b.Accepted(1, 100);
  EXPECT_DOUBLE_EQ(b.BoundFor(2, 1), 200);
  for (size_t i = 0; i < UpdateNormBound::kWindow; ++i) b.Accepted(2, 1);
  EXPECT_DOUBLE_EQ(b.BoundFor(3, 1), 2);
  // A round that accepted nothing leaves the history as it was.
  EXPECT_DOUBLE_EQ(b.BoundFor(5, 1), 2);
}

class NormBoundFederationTest : public ::testing::Test {
 protected:
  CoordinatorOptions Options(int64_t rounds, int64_t cohort) {
    CoordinatorOptions o;  // aggregation defaults: max_update_norm 0, auto_norm_factor 3
    o.job_name = "norm_bound";
    o.seed = 7;
    o.rounds = rounds;
    o.model = models::MlpSpec{6, {5}, 3};
    o.cohort.size = cohort;
    o.min_clients = cohort;
    o.quorum = 1;
    o.upload_slots = 2;
    o.round_deadline_ms = 60'000;
    o.client_timeout_ms = 0;
    o.eval_every = 0;
    return o;
  }

  static std::vector<SyntheticClient> Honest(int n) {
    std::vector<SyntheticClient> out;
    for (int i = 0; i < n; ++i) out.push_back({"c" + std::to_string(i), Behaviour::kHonest, 100});
    return out;
  }

  TensorList Run(const CoordinatorOptions& o, std::vector<SyntheticClient> clients, uint64_t seed,
                 std::vector<RoundMetrics>* metrics) {
    testing::JobRun job =
        testing::RunJob(o, {.clients = std::move(clients), .delivery_seed = seed});
    EXPECT_TRUE(job.status.ok()) << job.status;
    *metrics = std::move(job.metrics);
    return std::move(job.model);
  }
};

TEST_F(NormBoundFederationTest, ByDefaultOnePoisonedClientCannotRuinTheModel) {
  // Six honest clients and one that sends +1000 in every value of every update (within the
  // aggregation's |value| bound of 1024), over 5 rounds and several arrival orders.
  constexpr int kRounds = 5;
  const CoordinatorOptions o = Options(kRounds, 7);
  std::vector<SyntheticClient> clients = Honest(6);
  SyntheticClient poisoner{"poisoner", Behaviour::kFlat, 100};
  poisoner.value = 1000.0f;
  clients.push_back(poisoner);
  CoordinatorOptions honest_only = Options(kRounds, 6);
  honest_only.auto_norm_factor = 0;
  std::vector<RoundMetrics> honest_metrics;
  const TensorList reference = Run(honest_only, Honest(6), 1, &honest_metrics);
  int clipped_in_round_one = 0;
  for (uint64_t seed = 1; seed <= 8; ++seed) {
    std::vector<RoundMetrics> metrics;
    const TensorList model = Run(o, clients, seed, &metrics);
    ASSERT_EQ(metrics.size(), static_cast<size_t>(kRounds)) << "seed " << seed;
    for (const RoundMetrics& m : metrics) {
      EXPECT_TRUE(m.updated) << "seed " << seed << " round " << m.round;
      EXPECT_EQ(m.results, 7) << "seed " << seed << " round " << m.round;
      EXPECT_EQ(m.rejected, 0) << "seed " << seed << " round " << m.round;
    }
    for (int r = 1; r < kRounds; ++r) {
      // From round 2 on the bound is 3 x the median of round 1's norms: only the poisoner is
      // clipped, every round.
      EXPECT_EQ(metrics[r].clipped, 1) << "seed " << seed << " round " << r + 1;
    }
    // Honest deltas are N(0, 0.01^2) per value, about 0.07 in norm: a clipped poisoned update
    // (norm <= 3 x the median) moves the mean by at most 3/7 of a typical update per round.
    const double diff = MaxAbsDiff(model, reference);
    if (metrics[0].clipped == 1) {
      ++clipped_in_round_one;
      EXPECT_LT(diff, 0.05) << "seed " << seed;
    } else {
      // The residual: among round 1's first two arrivals the poisoned update is not clipped
      // (no norm is known yet), so the model moves by 1000/7 in every value, once.
      EXPECT_GT(diff, 100) << "seed " << seed;
      EXPECT_LT(diff, 1000.0 / 7 + 1) << "seed " << seed;
    }
  }
  EXPECT_GE(clipped_in_round_one, 4) << "of 8 arrival orders";
}

TEST_F(NormBoundFederationTest, AnHonestFederationIsUnchangedByTheDefaultBound) {
  const CoordinatorOptions automatic = Options(6, 6);
  CoordinatorOptions off = automatic;
  off.auto_norm_factor = 0;
  for (uint64_t seed = 1; seed <= 4; ++seed) {
    std::vector<RoundMetrics> a, b;
    const TensorList with_auto = Run(automatic, Honest(6), seed, &a);
    const TensorList with_off = Run(off, Honest(6), seed, &b);
    ASSERT_EQ(a.size(), 6u);
    for (const RoundMetrics& m : a) EXPECT_EQ(m.clipped, 0) << "seed " << seed;
    ASSERT_EQ(with_auto.size(), with_off.size());
    for (size_t t = 0; t < with_auto.size(); ++t) {
      EXPECT_EQ(std::memcmp(with_auto[t].data.data(), with_off[t].data.data(),
                            with_auto[t].data.size() * sizeof(float)),
                0)
          << "seed " << seed << " tensor " << t;
    }
  }
}

}  // namespace
}  // namespace huddle::coordinator
