// Finite-difference check of the whole backward chain an MLP uses:
//   x -> DenseForward -> ReluForward -> DenseForward -> SoftmaxCrossEntropy (mean loss)
// Every analytic gradient (both layers' weights and biases, and the input) is compared with a
// central difference of the mean loss computed by the same forward kernels.
#include <gtest/gtest.h>

#include <vector>

#include "kernels/activation.h"
#include "kernels/dense.h"
#include "kernels/loss.h"
#include "tests/kernels/kernel_test_util.h"

namespace huddle::kernels {
namespace {

using test_util::ExpectAllNear;
using test_util::RandomVector;

constexpr int64_t kBatch = 4, kIn = 5, kHidden = 6, kClasses = 3;

struct TinyNet {
  std::vector<float> x, w0, b0, w1, b1;
  std::vector<int32_t> labels;

  // Mean softmax cross-entropy of the current values.
  double Loss() const {
    std::vector<float> h(kBatch * kHidden), logits(kBatch * kClasses);
    DenseForward({kBatch, kIn, kHidden}, x.data(), w0.data(), b0.data(), h.data());
    ReluForward(h.data(), static_cast<int64_t>(h.size()));
    DenseForward({kBatch, kHidden, kClasses}, h.data(), w1.data(), b1.data(), logits.data());
    return SoftmaxCrossEntropy(logits.data(), labels.data(), kBatch, kClasses, nullptr).loss_sum /
           kBatch;
  }
};

// Central differences of net.Loss() with respect to every element of *values.
std::vector<double> NumericGradient(TinyNet& net, std::vector<float>* values) {
  constexpr float kEps = 1e-3f;
  std::vector<double> grad(values->size());
  for (size_t i = 0; i < values->size(); ++i) {
    const float saved = (*values)[i];
    (*values)[i] = saved + kEps;
    const double plus = net.Loss();
    (*values)[i] = saved - kEps;
    const double minus = net.Loss();
    (*values)[i] = saved;
    grad[i] = (plus - minus) / (2.0 * kEps);
  }
  return grad;
}

TEST(GradientCheckTest, DenseReluSoftmaxXentMatchesFiniteDifferences) {
  Rng rng(41);
  TinyNet net;
  net.x = RandomVector(rng, kBatch * kIn);
  // Small first-layer weights and biases of magnitude 1 keep every pre-activation at least 0.5
  // away from ReLU's kink, so finite differences are valid; negative biases give dead units, so
  // both sides of the ReLU mask are exercised.
  net.w0 = RandomVector(rng, kHidden * kIn, -0.1, 0.1);
  net.b0.resize(kHidden);
  for (int64_t j = 0; j < kHidden; ++j) net.b0[j] = j % 3 == 0 ? -1.0f : 1.0f;
  net.w1 = RandomVector(rng, kClasses * kHidden);
  net.b1 = RandomVector(rng, kClasses);
  net.labels = {0, 2, 1, 2};

  // Analytic gradients through the kernels.
  std::vector<float> h(kBatch * kHidden), logits(kBatch * kClasses);
  DenseForward({kBatch, kIn, kHidden}, net.x.data(), net.w0.data(), net.b0.data(), h.data());
  ReluForward(h.data(), static_cast<int64_t>(h.size()));
  DenseForward({kBatch, kHidden, kClasses}, h.data(), net.w1.data(), net.b1.data(), logits.data());
  std::vector<float> dlogits(logits.size());
  SoftmaxCrossEntropy(logits.data(), net.labels.data(), kBatch, kClasses, dlogits.data());
  std::vector<float> dw1(net.w1.size()), db1(net.b1.size()), dh(h.size());
  DenseBackward({kBatch, kHidden, kClasses}, h.data(), net.w1.data(), dlogits.data(), dw1.data(),
                db1.data(), dh.data());
  ReluBackward(h.data(), dh.data(), static_cast<int64_t>(dh.size()));
  std::vector<float> dw0(net.w0.size()), db0(net.b0.size()), dx(net.x.size());
  DenseBackward({kBatch, kIn, kHidden}, net.x.data(), net.w0.data(), dh.data(), dw0.data(),
                db0.data(), dx.data());

  constexpr double kAtol = 5e-4, kRtol = 1e-2;
  ExpectAllNear(dw1, NumericGradient(net, &net.w1), kAtol, kRtol, "fc1.weight");
  ExpectAllNear(db1, NumericGradient(net, &net.b1), kAtol, kRtol, "fc1.bias");
  ExpectAllNear(dw0, NumericGradient(net, &net.w0), kAtol, kRtol, "fc0.weight");
  ExpectAllNear(db0, NumericGradient(net, &net.b0), kAtol, kRtol, "fc0.bias");
  ExpectAllNear(dx, NumericGradient(net, &net.x), kAtol, kRtol, "input");
  // The dead units really have zero gradient.
  EXPECT_EQ(db0[0], 0.0f);
  EXPECT_NE(db0[1], 0.0f);
}

}  // namespace
}  // namespace huddle::kernels
