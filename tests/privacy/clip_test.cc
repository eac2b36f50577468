#include "privacy/clip.h"

#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "common/rng.h"
#include "tests/testing/tensors.h"

namespace huddle::privacy {
namespace {

using huddle::testing::BitwiseEqual;

TensorList MakeTensors(const std::vector<std::vector<float>>& parts) {
  TensorList tensors;
  for (size_t i = 0; i < parts.size(); ++i) {
    Tensor t("t" + std::to_string(i), {static_cast<int64_t>(parts[i].size())});
    t.data = parts[i];
    tensors.push_back(std::move(t));
  }
  return tensors;
}

std::vector<float> Flatten(const TensorList& tensors) {
  std::vector<float> out;
  for (const Tensor& t : tensors) out.insert(out.end(), t.data.begin(), t.data.end());
  return out;
}

// || a / |a| - b / |b| || in double.
double DirectionError(const std::vector<float>& a, const std::vector<float>& b) {
  double na = 0, nb = 0;
  for (float x : a) na += static_cast<double>(x) * x;
  for (float x : b) nb += static_cast<double>(x) * x;
  na = std::sqrt(na);
  nb = std::sqrt(nb);
  double e = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = a[i] / na - b[i] / nb;
    e += d * d;
  }
  return std::sqrt(e);
}

// Checks every ClipToNorm guarantee on `tensors` and `clip`.
void ExpectClipInvariants(TensorList tensors, double clip, const std::string& what) {
  SCOPED_TRACE(what);
  const std::vector<float> before = Flatten(tensors);
  const double norm = L2Norm(tensors);
  const ClipResult r = ClipToNorm(&tensors, clip);
  const std::vector<float> after = Flatten(tensors);
  EXPECT_EQ(r.norm_before, norm);
  EXPECT_EQ(r.norm_after, L2Norm(tensors));
  EXPECT_LE(r.norm_after, clip);  // exactly, as L2Norm computes it
  if (norm <= clip) {
    EXPECT_FALSE(r.clipped);
    EXPECT_TRUE(BitwiseEqual(before, after));
    return;
  }
  EXPECT_TRUE(r.clipped);
  // Close to the clip (only float rounding and a few ulp-sized nudges below it) unless the
  // values fell to float's subnormal range, where relative precision is lost.
  if (clip > 1e-30) {
    EXPECT_GE(r.norm_after, clip * (1 - 1e-6));
  }
  if (r.norm_after > 1e-30) {
    EXPECT_LT(DirectionError(before, after), 1e-6);
  }
}

TEST(ClipTest, L2NormInDouble) {
  const TensorList t = MakeTensors({{3, 4}, {12}});
  EXPECT_EQ(L2Norm(t), 13.0);
  EXPECT_EQ(L2Norm(TensorList{}), 0.0);
  // Float squares would overflow; double does not.
  const TensorList big = MakeTensors({{FLT_MAX, FLT_MAX}});
  EXPECT_DOUBLE_EQ(L2Norm(big), std::sqrt(2.0) * static_cast<double>(FLT_MAX));
  // And tiny values do not underflow to zero.
  EXPECT_GT(L2Norm(MakeTensors({{1e-30f, 1e-30f}})), 0.0);
}

TEST(ClipTest, L2NormPropagatesNonFinite) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_TRUE(std::isnan(L2Norm(MakeTensors({{1, nan, 2}}))));
  EXPECT_EQ(L2Norm(MakeTensors({{1}, {-inf}})), std::numeric_limits<double>::infinity());
  EXPECT_TRUE(std::isnan(L2Norm(MakeTensors({{inf}, {nan}}))));
}

// The same values split into different spans give bit-identical norms, so a receiver holding
// frames computes exactly what the sender computed on its tensors.
TEST(ClipTest, L2NormIndependentOfTheSplit) {
  Rng rng(3);
  std::vector<float> flat(1003);
  for (float& x : flat) x = static_cast<float>(rng.Normal());
  const TensorList whole = MakeTensors({flat});
  const double expected = L2Norm(whole);
  for (size_t a : {0, 1, 2, 3, 5, 500, 1003}) {
    for (size_t b : {a, a + 1, a + 7, size_t{1003}}) {
      if (b > flat.size()) continue;
      const std::span<const float> all(flat);
      const std::vector<std::span<const float>> spans = {all.subspan(0, a), all.subspan(a, b - a),
                                                         all.subspan(b)};
      EXPECT_EQ(L2Norm(spans), expected) << a << " " << b;
      const TensorList parts = MakeTensors({std::vector<float>(flat.begin(), flat.begin() + a),
                                            std::vector<float>(flat.begin() + a, flat.begin() + b),
                                            std::vector<float>(flat.begin() + b, flat.end())});
      EXPECT_EQ(L2Norm(parts), expected) << a << " " << b;
    }
  }
}

TEST(ClipTest, ZeroVectorIsUnchanged) {
  TensorList t = MakeTensors({{0, 0, 0}, {0}});
  const ClipResult r = ClipToNorm(&t, 1.0);
  EXPECT_FALSE(r.clipped);
  EXPECT_EQ(r.norm_before, 0);
  EXPECT_EQ(r.norm_after, 0);
  EXPECT_TRUE(BitwiseEqual(Flatten(t), std::vector<float>(4, 0.0f)));
  TensorList empty;
  EXPECT_FALSE(ClipToNorm(&empty, 1.0).clipped);
}

TEST(ClipTest, UnclippedInputIsBitwiseUnchanged) {
  TensorList t = MakeTensors({{0.1f, -0.2f, 0.3f}, {1e-20f, -0.0f}});
  const std::vector<float> before = Flatten(t);
  const ClipResult r = ClipToNorm(&t, 1.0);
  EXPECT_FALSE(r.clipped);
  EXPECT_EQ(r.norm_before, r.norm_after);
  EXPECT_TRUE(BitwiseEqual(before, Flatten(t)));
  // A norm exactly equal to the clip is not clipped either.
  TensorList exact = MakeTensors({{3, 4}});
  EXPECT_FALSE(ClipToNorm(&exact, 5.0).clipped);
  EXPECT_TRUE(BitwiseEqual(Flatten(exact), {3, 4}));
}

TEST(ClipTest, ClipsToTheNorm) {
  TensorList t = MakeTensors({{3, 4}, {12}});  // norm 13
  const ClipResult r = ClipToNorm(&t, 1.3);
  EXPECT_TRUE(r.clipped);
  EXPECT_EQ(r.norm_before, 13.0);
  EXPECT_LE(r.norm_after, 1.3);
  // Float rounding plus at most a few one-ulp nudges.
  EXPECT_NEAR(t[0].data[0], 0.3f, 3e-7);
  EXPECT_NEAR(t[0].data[1], 0.4f, 3e-7);
  EXPECT_NEAR(t[1].data[0], 1.2f, 3e-7);
}

TEST(ClipTest, RandomVectors) {
  Rng rng(11);
  for (int trial = 0; trial < 300; ++trial) {
    const int parts = 1 + trial % 4;
    std::vector<std::vector<float>> values(parts);
    const double scale = std::pow(10.0, -20 + (trial * 37) % 40);  // 1e-20 .. 1e19
    for (auto& part : values) {
      part.resize(1 + (trial * 7919 + part.size()) % 2000);
      for (float& x : part) x = static_cast<float>(scale * rng.Normal());
    }
    const TensorList t = MakeTensors(values);
    const double norm = L2Norm(t);
    for (double fraction : {0.01, 0.5, 0.999999, 1.0, 2.0}) {
      ExpectClipInvariants(
          t, norm * fraction,
          "trial " + std::to_string(trial) + " fraction " + std::to_string(fraction));
    }
  }
}

// Clips a hair below the norm: the scale rounds every float back to itself, so only the ulp
// nudges can bring the norm under the clip.
TEST(ClipTest, AdversarialNearTheBoundary) {
  Rng rng(12);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<float> v(1 + trial % 9);
    for (float& x : v) x = static_cast<float>(rng.Normal());
    if (trial % 3 == 0) std::fill(v.begin(), v.end(), 1.0f);  // all equal: ties everywhere
    const TensorList t = MakeTensors({v});
    const double norm = L2Norm(t);
    for (int ulps : {1, 2, 3, 100}) {
      double clip = norm;
      for (int i = 0; i < ulps; ++i) clip = std::nextafter(clip, 0.0);
      ExpectClipInvariants(t, clip,
                           "trial " + std::to_string(trial) + " ulps " + std::to_string(ulps));
    }
  }
}

TEST(ClipTest, ExtremeMagnitudes) {
  // Near float max: the scale is tiny but the double products stay finite.
  ExpectClipInvariants(MakeTensors({{FLT_MAX, -FLT_MAX}, {FLT_MAX}}), 1.0, "float max");
  ExpectClipInvariants(MakeTensors({{FLT_MAX}}), 3e38, "float max, clip just below");
  // Subnormal inputs.
  ExpectClipInvariants(MakeTensors({{1e-44f, -3e-45f, 1e-40f}}), 1e-41, "subnormal");
  // A clip so small that every value underflows: the result is zero, still within the clip.
  ExpectClipInvariants(MakeTensors({{1.0f, 2.0f}}), 1e-60, "underflow to zero");
  // Clip 0: everything goes to zero.
  TensorList t = MakeTensors({{1.0f, -2.0f}});
  const ClipResult r = ClipToNorm(&t, 0.0);
  EXPECT_TRUE(r.clipped);
  EXPECT_EQ(r.norm_after, 0.0);
}

TEST(ClipTest, NonFiniteInputReturns) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  TensorList t = MakeTensors({{1, nan}});
  const ClipResult r = ClipToNorm(&t, 1.0);  // unspecified result, but it returns
  EXPECT_TRUE(std::isnan(r.norm_before));
  TensorList u = MakeTensors({{1, inf}});
  ClipToNorm(&u, 1.0);
  TensorList v = MakeTensors({{1, 2}});
  ClipToNorm(&v, std::numeric_limits<double>::quiet_NaN());
  ClipToNorm(&v, -1.0);
}

}  // namespace
}  // namespace huddle::privacy
