// The MLP with batch normalization (MlpSpec::batch_norm): layout and initialisation, the training
// pass's gradients against central differences of the training-mode loss, running statistics,
// evaluation with them, learning, and DP-SGD's refusal.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>

#include "kernels/backend.h"
#include "models/dp_sgd.h"
#include "models/internal/net_workspace.h"
#include "models/model.h"
#include "tests/models/test_data.h"

namespace huddle::models {
namespace {

using internal::NetWorkspace;
using ::testing::HasSubstr;

TEST(BatchNormMlpTest, LayoutInitAndTrainableCount) {
  const MlpSpec spec{5, {6, 4}, 3, /*batch_norm=*/true};
  ASSERT_TRUE(ValidateModelSpec(spec).ok());
  const ModelLayout layout = Layout(spec);
  std::vector<std::string> names;
  for (const TensorSpec& t : layout) names.push_back(t.name);
  EXPECT_THAT(
      names, ::testing::ElementsAre("fc0.weight", "fc0.bias", "bn0.weight", "bn0.bias",
                                    "fc1.weight", "fc1.bias", "bn1.weight", "bn1.bias",
                                    "fc2.weight", "fc2.bias", "bn0.running_mean", "bn0.running_var",
                                    "bn1.running_mean", "bn1.running_var"));
  EXPECT_EQ(NumTrainable(spec), 10u);
  EXPECT_EQ(NumTrainable(MlpSpec{5, {6, 4}, 3}), 6u);
  const TensorList params = InitModel(spec, 3);
  ASSERT_TRUE(CheckParams(spec, params).ok());
  for (const Tensor& t : params) {
    const bool ones =
        t.name() == "bn0.weight" || t.name() == "bn1.weight" || t.name().ends_with("running_var");
    const bool random = t.name().starts_with("fc") && t.name().ends_with(".weight");
    for (float v : t.data) {
      if (ones) {
        EXPECT_EQ(v, 1.0f) << t.name();
      } else if (!random) {
        EXPECT_EQ(v, 0.0f) << t.name();
      }
    }
  }
  // The model without batch norm starts where it always did: batch norm only adds tensors.
  const TensorList plain = InitModel(MlpSpec{5, {6, 4}, 3}, 3);
  EXPECT_EQ(plain[0].data, params[0].data);
  // A batch-norm model's parameters do not fit the plain model and the reverse.
  EXPECT_FALSE(CheckParams(MlpSpec{5, {6, 4}, 3}, params).ok());
  EXPECT_FALSE(CheckParams(spec, plain).ok());
}

// The training pass of a batch-norm model through the workspace: loss (training mode, batch
// statistics) and gradients of the batch's mean loss, downloaded.
struct Pass {
  double loss = 0;
  std::vector<std::vector<float>> grads;  // per parameter
  TensorList after;                       // the parameters after Forward (running statistics)
};

Pass TrainingPass(const MlpSpec& spec, const TensorList& params, const data::Dataset& data) {
  auto backend = kernels::OpenCpuBackend();
  const int64_t n = data.size();
  auto ws = NetWorkspace::Create(*backend, spec, n, /*training=*/true);
  EXPECT_TRUE(ws.ok()) << ws.status();
  EXPECT_TRUE((*ws)->LoadData({&data, {}}).ok());
  (*ws)->UploadParams(params);
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), int64_t{0});
  EXPECT_TRUE((*ws)->SetOrder(order).ok());
  (*ws)->Gather(0, n);
  (*ws)->Forward(n, /*training=*/true);
  (*ws)->Backward(n);
  Pass pass;
  pass.loss = (*ws)->ReadTotals()->loss_sum / static_cast<double>(n);
  for (size_t i = 0; i < (*ws)->num_trainable(); ++i) {
    std::vector<float>& g = pass.grads.emplace_back((*ws)->param_size(i));
    const float* grad = (*ws)->grad(i);
    g.assign(grad, grad + (*ws)->param_size(i));
  }
  pass.after = params;
  EXPECT_TRUE((*ws)->DownloadParams(&pass.after).ok());
  return pass;
}

TEST(BatchNormMlpTest, GradientsMatchCentralDifferencesOfTheTrainingLoss) {
  const MlpSpec spec{5, {6, 4}, 3, /*batch_norm=*/true};
  const data::Dataset data = Blobs(12, 5, 3, 4);
  TensorList params = InitModel(spec, 8);
  // Gamma and beta away from 1 and 0, so that every term of the backward pass matters.
  for (Tensor& t : params) {
    if (!t.name().starts_with("bn") || t.name().find("running") != std::string::npos) continue;
    for (size_t i = 0; i < t.data.size(); ++i) t.data[i] += 0.3f * static_cast<float>(i % 3) - 0.2f;
  }
  const Pass pass = TrainingPass(spec, params, data);
  constexpr float kEps = 1e-3f;
  for (size_t t = 0; t < NumTrainable(spec); ++t) {
    for (size_t i = 0; i < params[t].data.size(); ++i) {
      TensorList probe = params;
      probe[t].data[i] += kEps;
      const double plus = TrainingPass(spec, probe, data).loss;
      probe[t].data[i] -= 2 * kEps;
      const double minus = TrainingPass(spec, probe, data).loss;
      const double numeric = (plus - minus) / (2.0 * kEps);
      EXPECT_NEAR(pass.grads[t][i], numeric, 2e-3 + 2e-2 * std::abs(numeric))
          << params[t].name() << "[" << i << "]";
    }
  }
}

TEST(BatchNormMlpTest, RunningStatisticsFollowTheBatch) {
  const MlpSpec spec{3, {2}, 2, /*batch_norm=*/true};
  const data::Dataset data = Blobs(8, 3, 2, 1);
  const TensorList params = InitModel(spec, 2);
  const Pass pass = TrainingPass(spec, params, data);
  // The dense layer's output, by hand in double, and its batch statistics.
  const Tensor& w = params[0];
  const Tensor& b = params[1];
  for (int f = 0; f < 2; ++f) {
    double sum = 0, sum_sq = 0;
    for (int64_t r = 0; r < 8; ++r) {
      double z = b.data[f];
      for (int j = 0; j < 3; ++j) z += double{w.data[f * 3 + j]} * data.features[r * 3 + j];
      sum += z;
      sum_sq += z * z;
    }
    const double mean = sum / 8, var = sum_sq / 8 - mean * mean;
    // running = 0.9 * initial + 0.1 * batch statistic (the unbiased variance).
    EXPECT_NEAR(pass.after[6].data[f], 0.1 * mean, 1e-5) << "running_mean " << f;
    EXPECT_NEAR(pass.after[7].data[f], 0.9 + 0.1 * var * 8 / 7, 1e-5) << "running_var " << f;
  }
}

TEST(BatchNormMlpTest, LearnsAndEvaluatesWithRunningStatistics) {
  const MlpSpec spec{8, {16}, 4, /*batch_norm=*/true};
  const data::Dataset train = Blobs(400, 8, 4, 1), test = Blobs(200, 8, 4, 2);
  TensorList params = InitModel(spec, 5);
  TrainOptions options;
  options.epochs = 5;
  options.batch_size = 16;
  options.learning_rate = 0.1;
  auto stats = TrainModel(spec, options, {&train, {}}, 9, &params);
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_GT(stats->accuracy, 0.85);  // over all epochs, the first included
  auto after = EvaluateModel(spec, params, {&test, {}});
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_GT(after->accuracy, 0.97);
  // Evaluation normalises with the running statistics, so it does not depend on the batch: one
  // row at a time gives the same loss as the whole set.
  auto one_by_one = EvaluateModel(spec, params, {&test, {}}, /*batch_size=*/1);
  ASSERT_TRUE(one_by_one.ok());
  EXPECT_EQ(one_by_one->accuracy, after->accuracy);
  EXPECT_NEAR(one_by_one->loss, after->loss, 1e-6);  // GEMM blocking differs by batch size
  // Training moved the running statistics away from their initial values.
  EXPECT_NE(params[4].data, std::vector<float>(16, 0.0f));
  EXPECT_NE(params[5].data, std::vector<float>(16, 1.0f));
}

TEST(BatchNormMlpTest, BitwiseDeterministicWithMomentum) {
  const MlpSpec spec{8, {16, 8}, 4, /*batch_norm=*/true};
  const data::Dataset train = Blobs(100, 8, 4, 3);
  TrainOptions options;
  options.epochs = 2;
  options.batch_size = 8;
  options.momentum = 0.9;
  options.weight_decay = 1e-3;
  TensorList a = InitModel(spec, 1), b = InitModel(spec, 1);
  ASSERT_TRUE(TrainModel(spec, options, {&train, {}}, 4, &a).ok());
  ASSERT_TRUE(TrainModel(spec, options, {&train, {}}, 4, &b).ok());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i].data, b[i].data) << a[i].name();
}

TEST(BatchNormMlpTest, DpSgdRefusesBatchNorm) {
  const MlpSpec spec{8, {16}, 4, /*batch_norm=*/true};
  const data::Dataset train = Blobs(100, 8, 4, 3);
  EXPECT_THAT(CheckDpSgdModel(spec).message(), HasSubstr("batch_norm"));
  EXPECT_TRUE(CheckDpSgdModel(MlpSpec{8, {16}, 4}).ok());
  TensorList params = InitModel(spec, 1);
  const TensorList before = params;
  DpSgdOptions dp;
  dp.expected_batch_size = 10;
  auto noise = privacy::NoiseSource::Secure();
  auto run = TrainDpSgd(spec, TrainOptions{}, dp, {&train, {}}, noise, &params);
  EXPECT_FALSE(run.ok());
  EXPECT_THAT(run.status().message(), HasSubstr("batch_norm"));
  for (size_t i = 0; i < params.size(); ++i) EXPECT_EQ(params[i].data, before[i].data);
  EXPECT_FALSE(PerExampleGradientNorms(spec, params, {&train, {}}, 10).ok());
}

}  // namespace
}  // namespace huddle::models
