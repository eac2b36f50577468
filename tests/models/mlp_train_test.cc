// TrainModel/EvaluateModel on small synthetic data: learning, determinism, batching and errors.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>

#include "common/rng.h"
#include "models/model.h"
#include "tests/models/test_data.h"

namespace huddle::models {
namespace {

using ::testing::HasSubstr;

const MlpSpec kSpec{8, {16}, 4};

TEST(TrainMlpTest, LearnsSeparableBlobs) {
  const data::Dataset train = Blobs(400, 8, 4, 1), test = Blobs(200, 8, 4, 2);
  TensorList params = InitModel(kSpec, 5);
  auto before = EvaluateModel(kSpec, params, {&test, {}});
  ASSERT_TRUE(before.ok()) << before.status();
  TrainOptions options;
  options.epochs = 5;
  options.batch_size = 16;
  options.learning_rate = 0.1;
  auto stats = TrainModel(kSpec, options, {&train, {}}, 9, &params);
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->examples, 2000);
  EXPECT_EQ(stats->steps, 5 * 25);
  EXPECT_GT(stats->accuracy, 0.9);
  auto after = EvaluateModel(kSpec, params, {&test, {}});
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->examples, 200);
  EXPECT_GT(after->accuracy, 0.97);
  EXPECT_LT(after->loss, before->loss / 4);
}

// One full-batch SGD step moves every parameter by -lr * dLoss/dparam. Recovering the gradient
// from that step and comparing it with central differences of EvaluateModel's loss checks the whole
// forward/backward chain (buffers, layer wiring, ReLU masks) end to end.
TEST(TrainMlpTest, FullBatchStepFollowsTheNumericalGradient) {
  const MlpSpec spec{5, {6, 4}, 3};
  const data::Dataset train = Blobs(12, 5, 3, 4);
  const TensorList initial = InitModel(spec, 8);
  TensorList stepped = initial;
  TrainOptions options;
  options.batch_size = 12;
  options.learning_rate = 1e-3;
  ASSERT_TRUE(TrainModel(spec, options, {&train, {}}, 1, &stepped).ok());

  constexpr float kEps = 1e-3f;
  TensorList probe = initial;
  auto loss = [&] { return EvaluateModel(spec, probe, {&train, {}})->loss; };
  for (size_t t = 0; t < probe.size(); ++t) {
    for (size_t i = 0; i < probe[t].data.size(); ++i) {
      const float saved = probe[t].data[i];
      probe[t].data[i] = saved + kEps;
      const double plus = loss();
      probe[t].data[i] = saved - kEps;
      const double minus = loss();
      probe[t].data[i] = saved;
      const double numeric = (plus - minus) / (2.0 * kEps);
      const double analytic =
          (double{initial[t].data[i]} - stepped[t].data[i]) / options.learning_rate;
      EXPECT_NEAR(analytic, numeric, 2e-3 + 2e-2 * std::abs(numeric))
          << probe[t].name() << "[" << i << "]";
    }
  }
}

TEST(TrainMlpTest, MomentumAndWeightDecayAlsoLearn) {
  const data::Dataset train = Blobs(400, 8, 4, 1), test = Blobs(200, 8, 4, 2);
  TensorList params = InitModel(MlpSpec{8, {16, 16}, 4}, 5);
  TrainOptions options;
  options.epochs = 5;
  options.learning_rate = 0.01;
  options.momentum = 0.9;
  options.weight_decay = 1e-4;
  ASSERT_TRUE(TrainModel(MlpSpec{8, {16, 16}, 4}, options, {&train, {}}, 3, &params).ok());
  auto eval = EvaluateModel(MlpSpec{8, {16, 16}, 4}, params, {&test, {}});
  ASSERT_TRUE(eval.ok());
  EXPECT_GT(eval->accuracy, 0.95);
}

TEST(TrainMlpTest, BitwiseDeterministic) {
  const data::Dataset train = Blobs(333, 8, 4, 1);
  TrainOptions options;
  options.epochs = 2;
  options.momentum = 0.5;
  TensorList a = InitModel(kSpec, 5), b = InitModel(kSpec, 5), c = InitModel(kSpec, 5);
  auto sa = TrainModel(kSpec, options, {&train, {}}, 11, &a);
  auto sb = TrainModel(kSpec, options, {&train, {}}, 11, &b);
  auto sc = TrainModel(kSpec, options, {&train, {}}, 12, &c);
  ASSERT_TRUE(sa.ok() && sb.ok() && sc.ok());
  EXPECT_EQ(sa->loss, sb->loss);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i].data, b[i].data) << a[i].name();
  EXPECT_NE(a[0].data, c[0].data);  // the seed drives the minibatch order
}

TEST(TrainMlpTest, LastPartialBatchIsIncluded) {
  const data::Dataset train = Blobs(10, 8, 4, 1);
  TensorList params = InitModel(kSpec, 5);
  TrainOptions options;
  options.batch_size = 4;
  options.epochs = 2;
  auto stats = TrainModel(kSpec, options, {&train, {}}, 1, &params);
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->steps, 6);  // 4 + 4 + 2, twice
  EXPECT_EQ(stats->examples, 20);
  // A batch larger than the data is one full-data step per epoch.
  options.batch_size = 1000;
  stats = TrainModel(kSpec, options, {&train, {}}, 1, &params);
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->steps, 2);
}

TEST(TrainMlpTest, TrainsOnlyTheViewsRows) {
  data::Dataset train = Blobs(100, 8, 4, 1);
  train.labels[0] = 99;  // outside the view, so never looked at
  std::vector<int64_t> rows;
  for (int64_t r = 1; r < 100; r += 2) rows.push_back(r);
  TensorList params = InitModel(kSpec, 5);
  auto stats = TrainModel(kSpec, TrainOptions{}, {&train, rows}, 1, &params);
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->examples, 50);
}

TEST(EvaluateMlpTest, BatchSizeDoesNotChangeTheResult) {
  const data::Dataset test = Blobs(257, 8, 4, 2);
  const TensorList params = InitModel(kSpec, 5);
  auto one = EvaluateModel(kSpec, params, {&test, {}}, 1);
  auto many = EvaluateModel(kSpec, params, {&test, {}}, 100);
  ASSERT_TRUE(one.ok() && many.ok());
  EXPECT_EQ(one->accuracy, many->accuracy);
  EXPECT_NEAR(one->loss, many->loss, 1e-6);
  EXPECT_FALSE(EvaluateModel(kSpec, params, {&test, {}}, 0).ok());
}

TEST(TrainMlpTest, RejectsBadInputsWithoutTouchingParams) {
  data::Dataset train = Blobs(20, 8, 4, 1);
  const TensorList initial = InitModel(kSpec, 5);
  TensorList params = initial;
  auto error = [&](const MlpSpec& spec, const TrainOptions& options, const data::Dataset& d) {
    auto result = TrainModel(spec, options, {&d, {}}, 1, &params);
    EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
    return std::string(result.status().message());
  };

  data::Dataset bad_label = train;
  bad_label.labels[7] = 4;
  EXPECT_THAT(error(kSpec, {}, bad_label), HasSubstr("example 7 has label 4, outside"));
  bad_label.labels[7] = -1;
  EXPECT_THAT(error(kSpec, {}, bad_label), HasSubstr("label -1"));

  const data::Dataset wide = Blobs(20, 9, 4, 1);
  EXPECT_THAT(error(kSpec, {}, wide),
              HasSubstr("9 features per example but the model's input [8] has 8"));

  EXPECT_THAT(error(MlpSpec{8, {32}, 4}, {}, train), HasSubstr("'fc0.weight' with shape [16,8]"));

  TrainOptions bad;
  bad.batch_size = 0;
  EXPECT_THAT(error(kSpec, bad, train), HasSubstr("batch_size"));
  bad = {};
  bad.learning_rate = NAN;
  EXPECT_THAT(error(kSpec, bad, train), HasSubstr("learning_rate"));
  bad = {};
  bad.momentum = 1.0;
  EXPECT_THAT(error(kSpec, bad, train), HasSubstr("momentum"));
  bad = {};
  bad.epochs = 0;
  EXPECT_THAT(error(kSpec, bad, train), HasSubstr("epochs"));

  EXPECT_THAT(error(kSpec, {}, data::Dataset{8, 4, {}, {}}), HasSubstr("no examples"));
  EXPECT_FALSE(TrainModel(kSpec, {}, {nullptr, {}}, 1, &params).ok());
  EXPECT_FALSE(TrainModel(kSpec, {}, {&train, {20}}, 1, &params).ok());
  EXPECT_FALSE(TrainModel(kSpec, {}, {&train, {}}, 1, nullptr).ok());
  for (size_t i = 0; i < params.size(); ++i) EXPECT_EQ(params[i].data, initial[i].data);
  EXPECT_FALSE(EvaluateModel(kSpec, params, {&bad_label, {}}).ok());
}

TEST(TrainMlpTest, DivergenceIsAnError) {
  const data::Dataset train = Blobs(64, 8, 4, 1);
  TensorList params = InitModel(kSpec, 5);
  TrainOptions options;
  options.learning_rate = 1e30;
  options.epochs = 3;
  auto result = TrainModel(kSpec, options, {&train, {}}, 1, &params);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(result.status().message(), HasSubstr("diverged"));
}

}  // namespace
}  // namespace huddle::models
