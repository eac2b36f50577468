// Layer-graph models (models/model.h) beyond the MLP: spec checks that name the layer and the
// dimension, parameter layouts, gradients of every layer kind against finite differences,
// DP-SGD's per-example norms against per-example gradients formed one example at a time,
// dropout, and training a small CNN.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <numeric>
#include <vector>

#include "common/rng.h"
#include "data/dataset.h"
#include "kernels/backend.h"
#include "models/dp_sgd.h"
#include "models/internal/net_workspace.h"
#include "models/model.h"
#include "models/wire_spec.h"
#include "privacy/noise.h"

namespace huddle::models {
namespace {

using ::testing::HasSubstr;

LayerSpec Dense(int64_t out) { return {.kind = LayerKind::kDense, .out = out}; }
LayerSpec Conv(int64_t out, int64_t kernel, int64_t stride = 0, int64_t padding = 0) {
  return {.kind = LayerKind::kConv2d,
          .out = out,
          .kernel = kernel,
          .stride = stride,
          .padding = padding};
}
LayerSpec Pool(LayerKind kind, int64_t kernel, int64_t stride = 0, int64_t padding = 0) {
  return {.kind = kind, .kernel = kernel, .stride = stride, .padding = padding};
}
LayerSpec GroupNorm(int64_t groups) { return {.kind = LayerKind::kGroupNorm, .groups = groups}; }
LayerSpec Dropout(double rate) { return {.kind = LayerKind::kDropout, .rate = rate}; }
LayerSpec Plain(LayerKind kind) { return {.kind = kind}; }
LayerSpec Scattering(int64_t scales, int64_t angles) {
  return {.kind = LayerKind::kScattering2d, .scales = scales, .angles = angles};
}

ModelSpec Model(std::vector<int64_t> input, std::vector<LayerSpec> layers) {
  ModelSpec spec;
  spec.input = std::move(input);
  spec.layers = std::move(layers);
  return spec;
}

// Every layer kind but batch norm (which mixes examples), in a model small enough for finite
// differences: [2,6,6] -> conv 4 k3 p1 -> group norm -> tanh -> max pool 2 -> conv 3 k2 -> relu
// -> avg pool 2 (padding 1) -> flatten -> dense 5 -> relu -> dense 3.
ModelSpec SmallCnn() {
  return Model({2, 6, 6}, {Conv(4, 3, 1, 1), GroupNorm(2), Plain(LayerKind::kTanh),
                           Pool(LayerKind::kMaxPool2d, 2), Conv(3, 2), Plain(LayerKind::kRelu),
                           Pool(LayerKind::kAvgPool2d, 2, 1, 1), Plain(LayerKind::kFlatten),
                           Dense(5), Plain(LayerKind::kRelu), Dense(3)});
}

data::Dataset RandomImages(int64_t n, int64_t dim, int64_t classes, uint64_t seed) {
  data::Dataset d;
  d.feature_dim = dim;
  d.num_classes = classes;
  Rng rng(seed);
  for (int64_t i = 0; i < n; ++i) {
    d.labels.push_back(static_cast<int32_t>(i % classes));
    for (int64_t j = 0; j < dim; ++j) d.features.push_back(static_cast<float>(rng.Normal()));
  }
  return d;
}

TEST(ModelSpecTest, ShapeErrorsNameTheLayerAndTheDimension) {
  EXPECT_TRUE(ValidateModelSpec(SmallCnn()).ok()) << ValidateModelSpec(SmallCnn());
  EXPECT_EQ(SmallCnn().num_classes(), 3);
  EXPECT_EQ(SmallCnn().input_dim(), 72);
  EXPECT_THAT(ValidateModelSpec(Model({1, 28, 28}, {Conv(8, 5), Dense(10)})).message(),
              HasSubstr("model layer 1 (dense) needs a flat input; it gets [8,24,24]: add a "
                        "flatten layer before it"));
  EXPECT_THAT(ValidateModelSpec(Model({784}, {Conv(8, 5), Plain(LayerKind::kFlatten), Dense(10)}))
                  .message(),
              HasSubstr("model layer 0 (conv2d) needs a [channels, height, width] input; it gets "
                        "[784]"));
  EXPECT_THAT(
      ValidateModelSpec(Model({1, 4, 4}, {Conv(8, 5), Plain(LayerKind::kFlatten), Dense(10)}))
          .message(),
      HasSubstr("model layer 0 (conv2d): kernel 5 is larger than height 4 plus padding 0"));
  EXPECT_THAT(
      ValidateModelSpec(Model({6, 4, 4}, {GroupNorm(4), Plain(LayerKind::kFlatten), Dense(10)}))
          .message(),
      HasSubstr("model layer 0 (group_norm): groups 4 does not divide its 6 channels"));
  EXPECT_THAT(ValidateModelSpec(Model({1, 8, 8}, {Conv(4, 3)})).message(),
              HasSubstr("it must be flat with one logit per class"));
  EXPECT_THAT(ValidateModelSpec(Model({8}, {Dense(4), Dropout(1.0), Dense(2)})).message(),
              HasSubstr("model layer 1 (dropout): rate is 1; it must be in [0, 1)"));
  EXPECT_THAT(ValidateModelSpec(Model({8}, {})).message(), HasSubstr("no layers"));
  EXPECT_THAT(ParseLayerKind("conv3d").status().message(),
              HasSubstr("unknown layer kind 'conv3d'; the kinds are dense, conv2d"));
  EXPECT_TRUE(InitModel(Model({1, 4, 4}, {Conv(8, 5)}), 1).empty());
}

TEST(ModelSpecTest, LayoutNamesByKindAndTheMlpShorthandKeepsItsLayout) {
  const ModelSpec cnn =
      Model({1, 28, 28}, {Conv(8, 5, 1, 2), GroupNorm(4), Plain(LayerKind::kRelu),
                          Pool(LayerKind::kMaxPool2d, 2), Plain(LayerKind::kFlatten), Dense(10)});
  const ModelLayout layout = Layout(cnn);
  ASSERT_EQ(layout.size(), 6u);
  EXPECT_EQ(layout[0].name, "conv0.weight");
  EXPECT_EQ(layout[0].shape, (std::vector<int64_t>{8, 1, 5, 5}));
  EXPECT_EQ(layout[2].name, "gn0.weight");
  EXPECT_EQ(layout[4].name, "fc0.weight");
  EXPECT_EQ(layout[4].shape, (std::vector<int64_t>{10, 8 * 14 * 14}));
  EXPECT_FALSE(AsMlp(cnn).has_value());
  EXPECT_THAT(DescribeModel(cnn), HasSubstr("1x28x28 > conv2d 8 k5 s1 p2 > group_norm g4"));

  // The shorthand: fc<l>, bn<l> and the running statistics last, as MLP files always had.
  const MlpSpec mlp{6, {5, 4}, 3, /*batch_norm=*/true};
  std::vector<std::string> names;
  for (const TensorSpec& t : Layout(mlp)) names.push_back(t.name);
  EXPECT_EQ(names, (std::vector<std::string>{
                       "fc0.weight", "fc0.bias", "bn0.weight", "bn0.bias", "fc1.weight", "fc1.bias",
                       "bn1.weight", "bn1.bias", "fc2.weight", "fc2.bias", "bn0.running_mean",
                       "bn0.running_var", "bn1.running_mean", "bn1.running_var"}));
  ASSERT_TRUE(AsMlp(mlp).has_value());
  EXPECT_EQ(AsMlp(mlp)->hidden, (std::vector<int64_t>{5, 4}));
  EXPECT_EQ(DescribeModel(mlp), "mlp 6-5-4-3 (batch norm)");
}

TEST(ModelSpecTest, TravelsOnTheWireAnMlpAsOne) {
  const ModelSpec cnn = SmallCnn();
  const wire::ModelSpec w = ModelSpecToWire(cnn);
  EXPECT_EQ(w.kind, "layers");
  auto back = ModelSpecFromWire(w);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, cnn);
  EXPECT_EQ(ModelSpecToWire(MlpSpec{}).kind, "mlp");
  wire::ModelSpec unknown = w;
  unknown.layers[1].kind = "attention";
  EXPECT_THAT(ModelSpecFromWire(unknown).status().message(), HasSubstr("'attention'"));
  wire::ModelSpec bad = w;
  bad.layers[0].kernel = 99;
  EXPECT_FALSE(ModelSpecFromWire(bad).ok());
}

// The mean loss of `params` on `data` (double precision of the float forward pass).
double MeanLoss(const ModelSpec& spec, const TensorList& params, const data::Dataset& data) {
  auto stats = EvaluateModel(spec, params, data::DatasetView{&data, {}});
  EXPECT_TRUE(stats.ok()) << stats.status();
  return stats->loss;
}

// Gradients of the mean loss over every row, from the workspace's backward pass.
std::vector<std::vector<float>> Gradients(const ModelSpec& spec, const TensorList& params,
                                          const data::Dataset& data) {
  auto backend = kernels::OpenCpuBackend();
  const int64_t n = data.size();
  auto ws = internal::NetWorkspace::Create(*backend, spec, n, /*training=*/true).value();
  EXPECT_TRUE(ws->LoadData(data::DatasetView{&data, {}}).ok());
  ws->UploadParams(params);
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), int64_t{0});
  EXPECT_TRUE(ws->SetOrder(order).ok());
  ws->Gather(0, n);
  ws->Forward(n, /*training=*/true);
  ws->Backward(n);
  std::vector<std::vector<float>> grads;
  for (size_t i = 0; i < ws->num_trainable(); ++i) {
    grads.emplace_back(ws->grad(i), ws->grad(i) + ws->param_size(i));
  }
  return grads;
}

void ExpectGradientsMatchFiniteDifferences(const ModelSpec& spec);

TEST(LayerGraphTest, EveryLayerKindsGradientMatchesFiniteDifferences) {
  // SmallCnn, and activations in place or not across a flatten (a tanh's backward pass reads its
  // output, so the tanh after the flatten must not overwrite it).
  for (const ModelSpec& spec :
       {SmallCnn(), Model({4}, {Dense(6), Plain(LayerKind::kTanh), Plain(LayerKind::kFlatten),
                                Plain(LayerKind::kTanh), Dense(3)})}) {
    SCOPED_TRACE(DescribeModel(spec));
    ExpectGradientsMatchFiniteDifferences(spec);
  }
}

void ExpectGradientsMatchFiniteDifferences(const ModelSpec& spec) {
  const data::Dataset data = RandomImages(5, spec.input_dim(), 3, 7);
  TensorList params = InitModel(spec, 3);
  ASSERT_FALSE(params.empty());
  // Non-trivial normalisation parameters.
  Rng rng(11);
  for (Tensor& t : params) {
    if (t.name().starts_with("gn") || t.name().ends_with(".bias")) {
      for (float& v : t.data) v = static_cast<float>(0.5 + 0.3 * rng.Normal());
    }
  }
  const std::vector<std::vector<float>> grads = Gradients(spec, params, data);
  ASSERT_EQ(grads.size(), params.size());
  const double h = 1e-2;
  int checked = 0, moving = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    // A few coordinates of every tensor.
    for (size_t k = 0; k < params[i].data.size(); k += 1 + params[i].data.size() / 4) {
      TensorList plus = params, minus = params;
      plus[i].data[k] += static_cast<float>(h);
      minus[i].data[k] -= static_cast<float>(h);
      const double numeric = (MeanLoss(spec, plus, data) - MeanLoss(spec, minus, data)) / (2 * h);
      EXPECT_NEAR(grads[i][k], numeric, 2e-3 + 0.05 * std::abs(numeric))
          << params[i].name() << "[" << k << "]";
      ++checked;
      moving += std::abs(numeric) > 1e-4;
    }
  }
  EXPECT_GT(checked, 12);
  EXPECT_GT(moving, checked / 2);  // the loss does depend on the parameters
}

// DP-SGD's per-example norms (ghost norms for dense, the cheaper exact method per convolution,
// group norm's per-example sums) equal the norms of gradients formed one example at a time.
TEST(LayerGraphTest, PerExampleNormsEqualOneExampleAtATime) {
  const std::vector<ModelSpec> specs = {
      // Convolutions with many output positions (direct instantiation is cheaper) ...
      Model({2, 6, 6}, {Conv(4, 3, 1, 1), GroupNorm(2), Plain(LayerKind::kRelu),
                        Pool(LayerKind::kAvgPool2d, 2), Plain(LayerKind::kFlatten), Dense(3)}),
      // ... and with few (ghost norms are).
      Model({2, 6, 6}, {Conv(16, 3, 3), GroupNorm(4), Plain(LayerKind::kTanh), Conv(16, 1),
                        Plain(LayerKind::kRelu), Pool(LayerKind::kMaxPool2d, 2),
                        Plain(LayerKind::kFlatten), Dense(3)}),
  };
  for (const ModelSpec& spec : specs) {
    SCOPED_TRACE(DescribeModel(spec));
    const data::Dataset data = RandomImages(6, spec.input_dim(), 3, 5);
    const TensorList params = InitModel(spec, 9);
    auto norms = PerExampleGradientNorms(spec, params, data::DatasetView{&data, {}}, 4);
    ASSERT_TRUE(norms.ok()) << norms.status();
    for (int64_t r = 0; r < data.size(); ++r) {
      data::Dataset one = data;
      one.labels = {data.labels[static_cast<size_t>(r)]};
      one.features.assign(data.row_features(r), data.row_features(r) + data.feature_dim);
      double squared = 0;
      for (const std::vector<float>& g : Gradients(spec, params, one)) {
        for (float v : g) squared += static_cast<double>(v) * v;
      }
      EXPECT_NEAR((*norms)[static_cast<size_t>(r)], std::sqrt(squared),
                  1e-4 * std::sqrt(squared) + 1e-6)
          << "row " << r;
    }
  }
}

TEST(LayerGraphTest, BatchNormIsRefusedUnderDpSgdPointingAtGroupNorm) {
  const ModelSpec spec = Model(
      {2, 4, 4}, {Conv(4, 3), Plain(LayerKind::kBatchNorm), Plain(LayerKind::kFlatten), Dense(2)});
  EXPECT_THAT(CheckDpSgdModel(spec).message(), HasSubstr("group_norm"));
  EXPECT_TRUE(CheckDpSgdModel(SmallCnn()).ok());
}

TEST(LayerGraphTest, DropoutIsIdentityInEvaluationAndSeededInTraining) {
  const ModelSpec with = Model({8}, {Dense(16), Plain(LayerKind::kRelu), Dropout(0.5), Dense(3)});
  const ModelSpec without = Model({8}, {Dense(16), Plain(LayerKind::kRelu), Dense(3)});
  const data::Dataset data = RandomImages(40, 8, 3, 2);
  const data::DatasetView view{&data, {}};
  TensorList params = InitModel(with, 4);
  EXPECT_EQ(EvaluateModel(with, params, view)->loss, EvaluateModel(without, params, view)->loss);
  TrainOptions options;
  options.batch_size = 8;
  TensorList a = params, b = params, c = params;
  ASSERT_TRUE(TrainModel(with, options, view, 1, &a).ok());
  ASSERT_TRUE(TrainModel(with, options, view, 1, &b).ok());
  ASSERT_TRUE(TrainModel(with, options, view, 2, &c).ok());
  EXPECT_EQ(a[0].data, b[0].data);
  EXPECT_NE(a[0].data, c[0].data);
}

// Four classes of 1x6x6 images, each a bright 3x3 square in its own quadrant, under noise.
data::Dataset Quadrants(int64_t n, uint64_t seed) {
  data::Dataset d;
  d.feature_dim = 36;
  d.num_classes = 4;
  Rng rng(seed);
  for (int64_t i = 0; i < n; ++i) {
    const auto label = static_cast<int32_t>(i % 4);
    d.labels.push_back(label);
    for (int64_t y = 0; y < 6; ++y) {
      for (int64_t x = 0; x < 6; ++x) {
        const bool lit = (y / 3) * 2 + (x / 3) == label;
        d.features.push_back(static_cast<float>((lit ? 1.0 : 0.0) + 0.3 * rng.Normal()));
      }
    }
  }
  return d;
}

// Trains `spec` on the quadrants task with SGD and with DP-SGD, expecting both to learn it;
// returns the SGD-trained parameters.
TensorList ExpectLearnsQuadrants(const ModelSpec& spec, const data::Dataset& train,
                                 const data::Dataset& test) {
  const data::DatasetView train_view{&train, {}}, test_view{&test, {}};
  TrainOptions options;
  options.epochs = 3;
  options.batch_size = 16;
  options.learning_rate = 0.1;
  TensorList sgd = InitModel(spec, 5);
  EXPECT_TRUE(TrainModel(spec, options, train_view, 1, &sgd).ok());
  EXPECT_GT(EvaluateModel(spec, sgd, test_view)->accuracy, 0.95);

  privacy::NoiseSource noise = privacy::NoiseSource::SeededForTesting(3);
  TensorList dp = InitModel(spec, 5);
  auto stats = TrainDpSgd(spec, options, DpSgdOptions{0.5, 1.0, 32}, train_view, noise, &dp);
  EXPECT_TRUE(stats.ok()) << stats.status();
  EXPECT_GT(EvaluateModel(spec, dp, test_view)->accuracy, 0.9);
  return sgd;
}

TEST(LayerGraphTest, ACnnLearnsWithSgdAndWithDpSgd) {
  ExpectLearnsQuadrants(
      Model({1, 6, 6}, {Conv(4, 3, 1, 1), GroupNorm(2), Plain(LayerKind::kRelu),
                        Pool(LayerKind::kMaxPool2d, 2), Plain(LayerKind::kFlatten), Dense(4)}),
      Quadrants(400, 1), Quadrants(200, 2));
}

TEST(ModelSpecTest, ScatteringIsAFixedFirstLayerWithoutParameters) {
  const ModelSpec spec =
      Model({2, 28, 20}, {Scattering(2, 8), GroupNorm(27), Plain(LayerKind::kFlatten), Dense(10)});
  auto shapes = LayerShapes(spec);
  ASSERT_TRUE(shapes.ok()) << shapes.status();
  EXPECT_EQ((*shapes)[0], (std::vector<int64_t>{162, 7, 5}));  // 2 x 81 paths, 28/4 x 20/4
  const ModelLayout layout = Layout(spec);
  ASSERT_EQ(layout.size(), 4u);  // gn0.*, fc0.*: the transform has none
  EXPECT_EQ(layout[0].name, "gn0.weight");
  EXPECT_EQ(layout[2].shape, (std::vector<int64_t>{10, 162 * 35}));
  EXPECT_THAT(DescribeModel(spec), HasSubstr("scattering2d J2 L8"));
  const wire::ModelSpec w = ModelSpecToWire(spec);
  EXPECT_EQ(w.layers[0].scales, 2);
  EXPECT_EQ(w.layers[0].angles, 8);
  EXPECT_EQ(ModelSpecFromWire(w).value(), spec);

  const auto error = [](const ModelSpec& bad) {
    return std::string(ValidateModelSpec(bad).message());
  };
  EXPECT_THAT(error(Model({1, 28, 28},
                          {Conv(4, 3), Scattering(2, 8), Plain(LayerKind::kFlatten), Dense(10)})),
              HasSubstr("model layer 1 (scattering2d) must be the first layer"));
  EXPECT_THAT(error(Model({1, 7, 28}, {Scattering(2, 8), Plain(LayerKind::kFlatten), Dense(10)})),
              HasSubstr("model layer 0 (scattering2d): the input height is 7; it must be in [8, "
                        "256]"));
  EXPECT_THAT(error(Model({1, 28, 28}, {Scattering(5, 8), Plain(LayerKind::kFlatten), Dense(10)})),
              HasSubstr("scales is 5; it must be in [1, 4]"));
  EXPECT_THAT(error(Model({1, 28, 28}, {Scattering(2, 0), Plain(LayerKind::kFlatten), Dense(10)})),
              HasSubstr("angles is 0"));
  EXPECT_THAT(error(Model({784}, {Scattering(2, 8), Dense(10)})),
              HasSubstr("needs a [channels, height, width] input"));
}

TEST(LayerGraphTest, AScatteringModelLearnsWithSgdAndDpSgdAndEvaluatesTheSameEveryWay) {
  // [1, 6, 6] -> scattering J1 L4 -> [5, 3, 3] -> group norm -> flatten -> dense 4.
  const ModelSpec spec =
      Model({1, 6, 6}, {Scattering(1, 4), GroupNorm(5), Plain(LayerKind::kFlatten), Dense(4)});
  const data::Dataset test = Quadrants(200, 2);
  const data::DatasetView test_view{&test, {}};
  const TensorList sgd = ExpectLearnsQuadrants(spec, Quadrants(400, 1), test);

  // The Evaluator transforms the data once and evaluates any number of models, as EvaluateModel.
  auto evaluator = Evaluator::Create(spec, test_view, 64);
  ASSERT_TRUE(evaluator.ok()) << evaluator.status();
  const TensorList fresh = InitModel(spec, 9);
  for (const TensorList* params : {&sgd, &fresh, &sgd}) {
    auto once = (*evaluator)->Evaluate(*params);
    ASSERT_TRUE(once.ok()) << once.status();
    auto each = EvaluateModel(spec, *params, test_view, 64);
    EXPECT_EQ(once->loss, each->loss);
    EXPECT_EQ(once->accuracy, each->accuracy);
  }
  EXPECT_THAT((*evaluator)->Evaluate(InitModel(SmallCnn(), 1)).status().message(),
              HasSubstr("parameter"));

  // A view of some rows loads (and transforms) those rows, in the view's order.
  std::vector<int64_t> rows(50);
  for (size_t i = 0; i < rows.size(); ++i) rows[i] = static_cast<int64_t>(199 - 3 * i);
  const data::Dataset selected = data::SelectRows(test, rows).value();
  auto of_view = EvaluateModel(spec, sgd, data::DatasetView{&test, rows});
  auto of_rows = EvaluateModel(spec, sgd, data::DatasetView{&selected, {}});
  EXPECT_NEAR(of_view->loss, of_rows->loss, 1e-6);
  EXPECT_EQ(of_view->accuracy, of_rows->accuracy);
}

}  // namespace
}  // namespace huddle::models
