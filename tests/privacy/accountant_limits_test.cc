// The accountants on hostile input: every call returns a value or a typed error (never a NaN,
// an exception, an unbounded allocation or an unbounded loop), the work limits are where the
// headers say, and a `stop` flag turns a long computation into Cancelled. No assertion here
// depends on timing: cancellation is tested with a flag that is already set.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <complex>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "privacy/accountant.h"
#include "privacy/internal/pld.h"
#include "privacy/internal/rdp.h"

namespace huddle::privacy {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr int64_t kHugeSteps = int64_t{1} << 62;

bool Contains(const Status& s, const std::string& text) {
  return std::string(s.message()).find(text) != std::string::npos;
}

// The dominant-term RDP, alpha / (2 z^2) + alpha / (alpha - 1) log q (exact where it applies).
double DominantTerm(double q, double z, double alpha) {
  return alpha * (0.5 / z / z) + alpha / (alpha - 1) * std::log(q);
}

TEST(RdpLimits, OrdersAboveTheMaximumAreInvalid) {
  for (double alpha : {1e300, 1e7, kMaxRdpOrder * (1 + 1e-15)}) {
    auto r = SubsampledGaussianRdp(0.1, 1, alpha);
    EXPECT_TRUE(absl::IsInvalidArgument(r.status())) << alpha;
    EXPECT_TRUE(Contains(r.status(), "Renyi order must be in (1, 1e+06] or +inf")) << r.status();
  }
  // The largest order, integer or not, has an answer (alpha / z is far past the quadrature
  // limit, where the closed form is exact); +inf stays allowed.
  for (double alpha : {kMaxRdpOrder, kMaxRdpOrder - 0.5}) {
    auto r = SubsampledGaussianRdp(0.1, 1, alpha);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_NEAR(*r / DominantTerm(0.1, 1, alpha), 1, 1e-15) << alpha;
  }
  EXPECT_EQ(*SubsampledGaussianRdp(0.1, 1, kInf), kInf);
}

TEST(RdpLimits, TinyNoiseHasAClosedForm) {
  // Formerly NaN (integer orders: exponents overflowed) or a std::bad_alloc / length_error
  // (fractional orders: a quadrature grid of alpha / z points).
  for (double alpha : {1.1, 2.0, 2.5, 10.9, 1024.0, 99999.5}) {
    for (double z : {1e-10, 1e-5}) {
      auto r = SubsampledGaussianRdp(0.1, z, alpha);
      ASSERT_TRUE(r.ok()) << alpha << " " << z << ": " << r.status();
      EXPECT_NEAR(*r / DominantTerm(0.1, z, alpha), 1, 1e-14) << alpha << " " << z;
    }
  }
  // Beyond the largest double: +inf, not NaN (the RDP is ~alpha / (2 z^2) ~ 1e600).
  for (double alpha : {2.0, 2.5, 1024.0}) {
    EXPECT_EQ(*SubsampledGaussianRdp(0.1, 1e-300, alpha), kInf) << alpha;
    EXPECT_EQ(*SubsampledGaussianRdp(1e-300, 1e-200, alpha), kInf) << alpha;
  }
  // Just below the overflow, with the top binomial exponent (alpha^2 / (2 z^2)) already infinite.
  auto r = SubsampledGaussianRdp(0.1, 1e-150, 1e5);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_NEAR(*r / 5e304, 1, 1e-14);
}

TEST(RdpLimits, ClosedFormAgreesWithTheExactMethodsWhereTheyMeet) {
  // The quadrature's grid limit: alpha / z just inside it (quadrature) and just past it (closed
  // form) give the same curve; and the binomial sum agrees with the closed form where both apply.
  for (double q : {1e-3, 0.1, 0.9}) {
    for (double alpha : {1.5, 2.5, 10.9}) {
      const double z_edge = alpha / (internal::kMaxQuadraturePoints / 2.0 - 80);
      const double z_in = z_edge * 1.001;
      ASSERT_LE(internal::QuadratureGridPoints(z_in, alpha), internal::kMaxQuadraturePoints);
      ASSERT_GT(internal::QuadratureGridPoints(z_edge * 0.999, alpha),
                internal::kMaxQuadraturePoints);
      auto quadrature = SubsampledGaussianRdp(q, z_in, alpha);
      auto closed = internal::DominantTermRdp(q, z_in, alpha);
      ASSERT_TRUE(quadrature.ok() && closed.ok()) << closed.status();
      EXPECT_NEAR(*quadrature / *closed, 1, 1e-12) << q << " " << alpha;
    }
    for (int64_t alpha : {2, 7, 1024}) {
      const double z = 1e-3;
      auto sum = SubsampledGaussianRdp(q, z, static_cast<double>(alpha));
      auto closed = internal::DominantTermRdp(q, z, static_cast<double>(alpha));
      ASSERT_TRUE(sum.ok() && closed.ok()) << closed.status();
      EXPECT_NEAR(*sum / *closed, 1, 1e-14) << q << " " << alpha;
    }
  }
}

TEST(RdpLimits, RefusesWhereNoBoundedMethodApplies) {
  // alpha within 1e-9 of 1 and alpha / z past the quadrature limit: the closed form's two ends
  // are far apart, and no exact method is within its work bound.
  auto r = SubsampledGaussianRdp(0.1, 1e-5, 1.000000001);
  EXPECT_TRUE(absl::IsResourceExhausted(r.status())) << r.status();
  EXPECT_TRUE(Contains(r.status(), "order 1.000000001")) << r.status();
  EXPECT_TRUE(Contains(r.status(), "65536 points")) << r.status();
  // The internals refuse rather than allocate: NaN, not a std::bad_alloc.
  EXPECT_TRUE(std::isnan(internal::LogAMinus1Quadrature(0.1, 1e-10, 2.5)));
  EXPECT_TRUE(std::isnan(internal::LogAMinus1Integer(0.1, 1.0, internal::kMaxBinomialOrder + 1)));
  EXPECT_TRUE(std::isfinite(internal::LogAMinus1Integer(0.1, 1.0, internal::kMaxBinomialOrder)));
}

TEST(RdpLimits, EveryHostileInputGivesANumberOrATypedError) {
  const double qs[] = {5e-324, 1e-300, 1e-10, 0.5, 1 - 1e-16, 1};
  const double zs[] = {0, 1e-300, 1e-160, 1e-154, 1e-10, 1e-5, 1e300, kInf};
  const double alphas[] = {1 + 1e-15, 1.1, 2, 2.5, 1024, 1e5, 1e5 + 0.5, 1e6, kInf};
  for (double q : qs) {
    for (double z : zs) {
      for (double alpha : alphas) {
        auto r = SubsampledGaussianRdp(q, z, alpha);
        if (r.ok()) {
          EXPECT_GE(*r, 0) << q << " " << z << " " << alpha;  // also false for NaN
        } else {
          EXPECT_TRUE(absl::IsResourceExhausted(r.status())) << q << " " << z << " " << alpha;
        }
      }
    }
  }
}

TEST(ComputeEpsilonLimits, TinyNoiseAndHugeStepsUnderRdp) {
  const std::vector<DpEvent> tiny = {{0.1, 1e-10, 100}};
  auto s = ComputeEpsilon(tiny, 1e-5, AccountantKind::kRdp);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_TRUE(std::isfinite(s->epsilon) && s->epsilon > 1e20) << s->epsilon;
  s = ComputeEpsilon(std::vector<DpEvent>{{0.1, 1e-300, 100}}, 1e-5, AccountantKind::kRdp);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->epsilon, kInf);
  s = ComputeEpsilon(std::vector<DpEvent>{{0.1, 1, kHugeSteps}}, 1e-5, AccountantKind::kRdp);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_TRUE(std::isfinite(s->epsilon) && s->epsilon > 1e15) << s->epsilon;
}

TEST(ComputeEpsilonLimits, PldRefusesPastItsGrid) {
  struct Case {
    DpEvent event;
    const char* message;
  };
  for (const Case& c : {Case{{0.1, 1e-300, 100}, "an unbounded grid"},
                        Case{{0.1, 1e-10, 100}, "grid points (more than 16777216)"},
                        Case{{0.1, 0.01, 100}, "grid points (more than 16777216)"},
                        Case{{0.1, 1, kHugeSteps}, "grid points (more than 16777216)"},
                        Case{{1, 1, kHugeSteps}, "grid points (more than 16777216)"},
                        Case{{0.1, 1e6, kHugeSteps}, "grid points (more than 16777216)"}}) {
    auto s = ComputeEpsilon(std::vector<DpEvent>{c.event}, 1e-5, AccountantKind::kPld);
    EXPECT_TRUE(absl::IsResourceExhausted(s.status()))
        << c.event.noise_multiplier << " " << c.event.steps << ": " << s.status();
    EXPECT_TRUE(Contains(s.status(), c.message)) << s.status();
  }
  // A denormal interval: every loss is an unbounded number of grid steps.
  PldOptions denormal;
  denormal.value_discretization_interval = 5e-324;
  auto s = ComputeEpsilon(std::vector<DpEvent>{{0.1, 1, 10}}, 1e-5, AccountantKind::kPld, denormal);
  EXPECT_TRUE(absl::IsResourceExhausted(s.status())) << s.status();
  // A subnormal sampling rate (1 / q overflows) is a proper, nearly-zero PLD, not NaN garbage.
  for (AccountantKind kind : {AccountantKind::kRdp, AccountantKind::kPld}) {
    s = ComputeEpsilon(std::vector<DpEvent>{{5e-324, 1, 100}}, 1e-5, kind);
    ASSERT_TRUE(s.ok()) << AccountantName(kind) << ": " << s.status();
    EXPECT_EQ(s->epsilon, 0) << AccountantName(kind);
  }
  auto subnormal = internal::SubsampledGaussianPld(5e-324, 1, 1e-4);
  ASSERT_TRUE(subnormal.ok()) << subnormal.status();
  EXPECT_EQ(subnormal->remove.infinity_mass, 0);
  // Infinite noise spends nothing, whatever the steps.
  s = ComputeEpsilon(std::vector<DpEvent>{{0.1, 1e300, kHugeSteps}}, 1e-5, AccountantKind::kPld);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->epsilon, 0);
}

TEST(PldLimits, LossIndicesNeverOverflow) {
  // A point mass at loss -5 steps composed 2^62 times sits at -5 * 2^62 steps: past int64.
  const internal::PldPmf point{1e-4, -5, {1.0}, 0.0};
  auto self = internal::SelfCompose(point, kHugeSteps);
  EXPECT_TRUE(absl::IsResourceExhausted(self.status())) << self.status();
  EXPECT_TRUE(Contains(self.status(), "losses pass")) << self.status();
  const internal::PldPmf far{1e-4, int64_t{1} << 62, {0.5, 0.5}, 0.0};
  auto sum = internal::Compose(far, far);
  EXPECT_TRUE(absl::IsResourceExhausted(sum.status())) << sum.status();
  // A "PMF" with almost no finite mass has an empty Chernoff window: an error, not a
  // negative-length allocation.
  const internal::PldPmf lost{1e-4, 0, {1e-12, 0, 0}, 0.0};
  EXPECT_TRUE(absl::IsInternal(internal::SelfCompose(lost, 100).status()));
  // In range, the same point mass composes exactly.
  auto ok = internal::SelfCompose(point, 1000);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->lower_loss, -5000);
}

TEST(AccountantCancellation, AStopFlagThatIsSetCancelsEveryLongComputation) {
  const std::atomic<bool> stop{true};
  const std::vector<DpEvent> events = {{0.1, 1.0, 100}};
  for (AccountantKind kind : {AccountantKind::kRdp, AccountantKind::kPld}) {
    auto s = ComputeEpsilon(events, 1e-5, kind, {}, &stop);
    EXPECT_TRUE(absl::IsCancelled(s.status())) << AccountantName(kind) << ": " << s.status();
    auto z = CalibrateNoiseMultiplier(1, 1e-5, 0.1, 100, kind, {}, &stop);
    EXPECT_TRUE(absl::IsCancelled(z.status())) << AccountantName(kind) << ": " << z.status();
  }
  // Each of the PLD's long loops looks at the flag itself.
  EXPECT_TRUE(absl::IsCancelled(internal::SubsampledGaussianPld(0.1, 1, 1e-4, &stop).status()));
  auto pld = internal::SubsampledGaussianPld(0.1, 1, 1e-4);
  ASSERT_TRUE(pld.ok()) << pld.status();
  const double tail = internal::kTailMassTruncation;
  EXPECT_TRUE(absl::IsCancelled(internal::SelfCompose(pld->remove, 10, tail, &stop).status()));
  EXPECT_TRUE(absl::IsCancelled(internal::SelfCompose(pld->remove, 10, 0.0, &stop).status()));
  EXPECT_TRUE(absl::IsCancelled(internal::Compose(pld->remove, *pld->add, tail, &stop).status()));
  std::vector<std::complex<double>> data(1024, 1.0);
  EXPECT_TRUE(absl::IsCancelled(internal::Fft(data, false, &stop)));
}

TEST(AccountantCancellation, AFlagThatStaysClearChangesNothing) {
  const std::atomic<bool> stop{false};
  const std::vector<DpEvent> events = {{0.05, 0.9, 50}, {1.0, 4.0, 2}};
  for (AccountantKind kind : {AccountantKind::kRdp, AccountantKind::kPld}) {
    auto with = ComputeEpsilon(events, 1e-6, kind, {}, &stop);
    auto without = ComputeEpsilon(events, 1e-6, kind);
    ASSERT_TRUE(with.ok() && without.ok()) << with.status();
    EXPECT_EQ(with->epsilon, without->epsilon) << AccountantName(kind);
  }
  auto with = CalibrateNoiseMultiplier(2, 1e-5, 0.05, 50, AccountantKind::kRdp, {}, &stop);
  auto without = CalibrateNoiseMultiplier(2, 1e-5, 0.05, 50, AccountantKind::kRdp);
  ASSERT_TRUE(with.ok() && without.ok()) << with.status();
  EXPECT_EQ(*with, *without);
}

TEST(CalibrationLimits, TargetsOutOfReachAreInvalidArguments) {
  // Formerly: 1e300 searched forever (RDP, PLD) or answered the search's floor (q = 1).
  struct Case {
    double target, q;
    AccountantKind kind;
  };
  for (const Case& c :
       {Case{1e300, 0.1, AccountantKind::kRdp}, Case{1e300, 1, AccountantKind::kRdp},
        Case{1e300, 0.1, AccountantKind::kPld}, Case{1e300, 1, AccountantKind::kAnalytic}}) {
    auto z = CalibrateNoiseMultiplier(c.target, 1e-5, c.q, 100, c.kind);
    EXPECT_TRUE(absl::IsInvalidArgument(z.status()))
        << AccountantName(c.kind) << ": " << z.status();
    EXPECT_TRUE(Contains(z.status(), "too large to calibrate")) << z.status();
  }
  for (AccountantKind kind : {AccountantKind::kRdp, AccountantKind::kAnalytic}) {
    auto z = CalibrateNoiseMultiplier(1e-300, 1e-300, 1, kHugeSteps, kind);
    EXPECT_TRUE(absl::IsInvalidArgument(z.status())) << z.status();
    EXPECT_TRUE(Contains(z.status(), "no noise multiplier up to 1e+12")) << z.status();
  }
  // Large but meaningful targets still calibrate (z well above the search's floor).
  auto z = CalibrateNoiseMultiplier(1e6, 1e-5, 0.1, 100, AccountantKind::kRdp);
  ASSERT_TRUE(z.ok()) << z.status();
  EXPECT_GT(*z, kMinCalibratedNoise);
}

}  // namespace
}  // namespace huddle::privacy
