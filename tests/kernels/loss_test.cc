// SoftmaxCrossEntropy against a double-precision reference, plus stability and edge cases.
#include "kernels/loss.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "tests/kernels/kernel_test_util.h"

namespace huddle::kernels {
namespace {

using test_util::ExpectAllNear;
using test_util::RandomVector;

struct ReferenceLoss {
  double loss_sum = 0.0;
  int64_t correct = 0;
  std::vector<double> dlogits;
};

ReferenceLoss Reference(const std::vector<float>& logits, const std::vector<int32_t>& labels,
                        int64_t batch, int64_t classes) {
  ReferenceLoss ref;
  ref.dlogits.resize(logits.size());
  for (int64_t r = 0; r < batch; ++r) {
    double max = logits[r * classes];
    int64_t argmax = 0;
    for (int64_t c = 1; c < classes; ++c) {
      if (logits[r * classes + c] > max) {
        max = logits[r * classes + c];
        argmax = c;
      }
    }
    double sum = 0.0;
    for (int64_t c = 0; c < classes; ++c) sum += std::exp(logits[r * classes + c] - max);
    ref.loss_sum += std::log(sum) + max - logits[r * classes + labels[r]];
    ref.correct += argmax == labels[r];
    for (int64_t c = 0; c < classes; ++c) {
      const double p = std::exp(logits[r * classes + c] - max) / sum;
      ref.dlogits[r * classes + c] = (p - (c == labels[r] ? 1.0 : 0.0)) / batch;
    }
  }
  return ref;
}

std::vector<int32_t> RandomLabels(Rng& rng, int64_t batch, int64_t classes) {
  std::vector<int32_t> labels(static_cast<size_t>(batch));
  for (int32_t& l : labels) l = static_cast<int32_t>(rng.UniformInt(classes));
  return labels;
}

TEST(SoftmaxCrossEntropyTest, MatchesReference) {
  for (const auto& [batch, classes] :
       {std::pair<int64_t, int64_t>{1, 1}, {1, 10}, {32, 10}, {7, 3}, {100, 37}}) {
    SCOPED_TRACE(testing::Message() << "batch=" << batch << " classes=" << classes);
    Rng rng(DeriveSeed(21, batch, classes));
    const auto logits = RandomVector(rng, batch * classes, -5.0, 5.0);
    const auto labels = RandomLabels(rng, batch, classes);
    std::vector<float> dlogits(logits.size(), 9.0f);
    const LossTotals got =
        SoftmaxCrossEntropy(logits.data(), labels.data(), batch, classes, dlogits.data());
    const ReferenceLoss ref = Reference(logits, labels, batch, classes);
    EXPECT_NEAR(got.loss_sum, ref.loss_sum, 1e-5 + 1e-5 * ref.loss_sum);
    EXPECT_EQ(got.correct, ref.correct);
    ExpectAllNear(dlogits, ref.dlogits, 1e-6, 1e-4, "dlogits");
  }
}

TEST(SoftmaxCrossEntropyTest, StableForHugeLogits) {
  // Row 0: the label's logit is 2e4 below the maximum. Row 1: the label wins by 2.
  const std::vector<float> logits = {1e4f, -1e4f, 0.0f, 3e4f, 3e4f - 2.0f, -3e4f};
  const std::vector<int32_t> labels = {1, 0};
  std::vector<float> dlogits(logits.size());
  const LossTotals got = SoftmaxCrossEntropy(logits.data(), labels.data(), 2, 3, dlogits.data());
  const double row1 = std::log(1.0 + std::exp(-2.0));
  EXPECT_NEAR(got.loss_sum, 2e4 + row1, 1e-2);
  EXPECT_EQ(got.correct, 1);
  for (float g : dlogits) EXPECT_TRUE(std::isfinite(g));
  EXPECT_NEAR(dlogits[1], -0.5, 1e-6);  // (0 - 1) / batch
}

TEST(SoftmaxCrossEntropyTest, InPlaceGradientEqualsSeparateBuffer) {
  Rng rng(22);
  const int64_t batch = 13, classes = 10;
  auto logits = RandomVector(rng, batch * classes, -3.0, 3.0);
  const auto labels = RandomLabels(rng, batch, classes);
  std::vector<float> separate(logits.size());
  const LossTotals a =
      SoftmaxCrossEntropy(logits.data(), labels.data(), batch, classes, separate.data());
  const LossTotals b =
      SoftmaxCrossEntropy(logits.data(), labels.data(), batch, classes, logits.data());
  EXPECT_EQ(a.loss_sum, b.loss_sum);
  EXPECT_EQ(a.correct, b.correct);
  EXPECT_EQ(logits, separate);
}

TEST(SoftmaxCrossEntropyTest, NullGradientAndTiesResolveToFirstMaximum) {
  // Row 1 ties classes 0 and 1; the first maximum (0) is the prediction.
  const std::vector<float> logits = {0.0f, 0.0f, 1.0f, 2.0f, 2.0f, 1.0f};
  const std::vector<int32_t> labels = {2, 0};
  const LossTotals got = SoftmaxCrossEntropy(logits.data(), labels.data(), 2, 3, nullptr);
  EXPECT_EQ(got.correct, 2);
  const double expected = Reference(logits, labels, 2, 3).loss_sum;
  EXPECT_NEAR(got.loss_sum, expected, 1e-6);
}

}  // namespace
}  // namespace huddle::kernels
