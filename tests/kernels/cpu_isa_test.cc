// The per-instruction-set CPU kernels (kernels/cpu_isa.h): the choice and its override, and that
// each set runs its own code. The baseline variant must equal, bit for bit, the same Eigen product
// compiled here with the project's (baseline) flags, and the AVX2 and AVX-512 variants must differ
// from it (their GEMMs fuse multiply-adds): had the link merged the sets' same-named template
// instantiations (cmake/HuddleCpuIsa.cmake), one would fail. AVX2 and AVX-512 may round alike (each
// output's multiply-adds run in the same order in both, unless the blocking differs), so that the
// AVX-512 object holds 512-bit code is checked where it is linked (cmake/cpu_isa_object.cmake).
#include "kernels/cpu_isa.h"

#include <absl/strings/str_cat.h>
#include <gtest/gtest.h>

#include <Eigen/Core>
#include <vector>

#include "kernels/dense.h"
#include "tests/kernels/kernel_test_util.h"

namespace huddle::kernels {
namespace {

using test_util::RandomVector;

// Restores the active set after each test.
class CpuIsaTest : public testing::Test {
 protected:
  void TearDown() override { ASSERT_TRUE(SetCpuIsa(saved_).ok()); }

  // DenseForward on `isa`, x[32, 200] · w[48, 200]ᵀ + b (large enough for Eigen's GEMM path).
  static std::vector<float> Forward(CpuIsa isa) {
    EXPECT_TRUE(SetCpuIsa(isa).ok());
    std::vector<float> y(static_cast<size_t>(kShape.batch * kShape.out));
    DenseForward(kShape, x_.data(), w_.data(), b_.data(), y.data());
    return y;
  }

  // The same product by Eigen compiled in this file.
  static std::vector<float> ForwardHere() {
    using Matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
    std::vector<float> y(static_cast<size_t>(kShape.batch * kShape.out));
    Eigen::Map<Matrix> y_m(y.data(), kShape.batch, kShape.out);
    y_m.noalias() = Eigen::Map<const Matrix>(x_.data(), kShape.batch, kShape.in) *
                    Eigen::Map<const Matrix>(w_.data(), kShape.out, kShape.in).transpose();
    y_m.rowwise() += Eigen::Map<const Eigen::RowVectorXf>(b_.data(), kShape.out);
    return y;
  }

  static constexpr DenseShape kShape{32, 200, 48};
  static inline Rng rng_{19};
  static inline const std::vector<float> x_ = RandomVector(rng_, kShape.batch* kShape.in);
  static inline const std::vector<float> w_ = RandomVector(rng_, kShape.out* kShape.in);
  static inline const std::vector<float> b_ = RandomVector(rng_, kShape.out);
  const CpuIsa saved_ = ActiveCpuIsa();
};

TEST_F(CpuIsaTest, NamesRoundTrip) {
  for (CpuIsa isa : {CpuIsa::kBaseline, CpuIsa::kAvx2, CpuIsa::kAvx512}) {
    auto parsed = ParseCpuIsa(CpuIsaName(isa));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, isa);
  }
  const auto bad = ParseCpuIsa("avx-512");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(),
            "CPU instruction set 'avx-512' is not one of baseline, avx2, avx512");
}

TEST_F(CpuIsaTest, ChoiceFollowsTheOverrideOnlyWhenItCanRun) {
  const CpuIsa best = CpuIsaSupported(CpuIsa::kAvx512) ? CpuIsa::kAvx512
                      : CpuIsaSupported(CpuIsa::kAvx2) ? CpuIsa::kAvx2
                                                       : CpuIsa::kBaseline;
  EXPECT_EQ(ChooseCpuIsa(nullptr).isa, best);
  EXPECT_EQ(ChooseCpuIsa(nullptr).reason, "best this CPU supports");
  EXPECT_EQ(ChooseCpuIsa("").isa, best);
  const CpuIsaChoice baseline = ChooseCpuIsa("baseline");
  EXPECT_EQ(baseline.isa, CpuIsa::kBaseline);
  EXPECT_EQ(baseline.reason, "HUDDLE_CPU_ISA=baseline");
  const CpuIsaChoice typo = ChooseCpuIsa("avx-2");
  EXPECT_EQ(typo.isa, best);
  EXPECT_EQ(typo.reason,
            "HUDDLE_CPU_ISA ignored: CPU instruction set 'avx-2' is not one of baseline, avx2, "
            "avx512");
  for (CpuIsa isa : {CpuIsa::kAvx2, CpuIsa::kAvx512}) {
    const CpuIsaChoice choice = ChooseCpuIsa(CpuIsaName(isa));
    if (CpuIsaSupported(isa)) {
      EXPECT_EQ(choice.isa, isa);
      EXPECT_EQ(choice.reason, absl::StrCat("HUDDLE_CPU_ISA=", CpuIsaName(isa)));
    } else {
      EXPECT_EQ(choice.isa, best);
      EXPECT_NE(choice.reason.find("ignored"), std::string::npos) << choice.reason;
    }
  }
}

TEST_F(CpuIsaTest, SetCpuIsaSwitchesTheActiveSet) {
  ASSERT_TRUE(SetCpuIsa(CpuIsa::kBaseline).ok());
  EXPECT_EQ(ActiveCpuIsa(), CpuIsa::kBaseline);
  EXPECT_EQ(CpuIsaDescription().rfind("baseline", 0), 0u) << CpuIsaDescription();
  for (CpuIsa isa : {CpuIsa::kAvx2, CpuIsa::kAvx512}) {
    ASSERT_TRUE(SetCpuIsa(CpuIsa::kBaseline).ok());
    const Status set = SetCpuIsa(isa);
    EXPECT_EQ(set.ok(), CpuIsaSupported(isa)) << set;
    EXPECT_EQ(ActiveCpuIsa(), set.ok() ? isa : CpuIsa::kBaseline);
  }
}

TEST_F(CpuIsaTest, BaselineVariantIsTheBaselineCode) {
  const std::vector<float> baseline = Forward(CpuIsa::kBaseline);
  EXPECT_EQ(baseline, ForwardHere());
  EXPECT_EQ(baseline, Forward(CpuIsa::kBaseline));  // reproducible
}

TEST_F(CpuIsaTest, Avx2VariantRunsItsOwnCode) {
  if (!CpuIsaSupported(CpuIsa::kAvx2)) GTEST_SKIP() << "this CPU or build has no AVX2 + FMA";
  const std::vector<float> avx2 = Forward(CpuIsa::kAvx2);
  const std::vector<float> baseline = Forward(CpuIsa::kBaseline);
  EXPECT_NE(avx2, baseline) << "the AVX2 variant rounds exactly as the baseline: not its code?";
  EXPECT_EQ(avx2, Forward(CpuIsa::kAvx2));  // reproducible
  for (size_t i = 0; i < avx2.size(); ++i) {
    ASSERT_NEAR(avx2[i], baseline[i], 1e-4 * (1.0 + std::abs(baseline[i]))) << i;
  }
}

TEST_F(CpuIsaTest, Avx512VariantRunsItsOwnCode) {
  if (!CpuIsaSupported(CpuIsa::kAvx512)) GTEST_SKIP() << "this CPU or build has no AVX-512";
  const std::vector<float> avx512 = Forward(CpuIsa::kAvx512);
  const std::vector<float> baseline = Forward(CpuIsa::kBaseline);
  EXPECT_NE(avx512, baseline) << "the AVX-512 variant rounds exactly as the baseline";
  EXPECT_EQ(avx512, Forward(CpuIsa::kAvx512));  // reproducible
  for (size_t i = 0; i < avx512.size(); ++i) {
    ASSERT_NEAR(avx512[i], baseline[i], 1e-4 * (1.0 + std::abs(baseline[i]))) << i;
  }
}

// DenseForward's path for large weights (in * out >= 2^20: w packed as the right operand) on every
// set, against a double-precision reference.
TEST_F(CpuIsaTest, LargeWeightsForwardMatchesReference) {
  constexpr DenseShape kLarge{3, 1024, 1024};
  Rng rng(7);
  const std::vector<float> x = RandomVector(rng, kLarge.batch * kLarge.in);
  const std::vector<float> w = RandomVector(rng, kLarge.out * kLarge.in);
  const std::vector<float> b = RandomVector(rng, kLarge.out);
  std::vector<double> ref(static_cast<size_t>(kLarge.batch * kLarge.out));
  for (int64_t r = 0; r < kLarge.batch; ++r) {
    for (int64_t o = 0; o < kLarge.out; ++o) {
      double acc = b[o];
      for (int64_t i = 0; i < kLarge.in; ++i)
        acc += double{x[r * kLarge.in + i]} * w[o * kLarge.in + i];
      ref[r * kLarge.out + o] = acc;
    }
  }
  for (CpuIsa isa : {CpuIsa::kBaseline, CpuIsa::kAvx2, CpuIsa::kAvx512}) {
    if (!CpuIsaSupported(isa)) continue;
    ASSERT_TRUE(SetCpuIsa(isa).ok());
    std::vector<float> y(ref.size());
    DenseForward(kLarge, x.data(), w.data(), b.data(), y.data());
    test_util::ExpectAllNear(y, ref, 1e-4, 1e-4, CpuIsaName(isa));
  }
}

}  // namespace
}  // namespace huddle::kernels
