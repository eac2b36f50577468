// MlpSpec validation, layout, initialisation and parameter checks.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>

#include "models/model.h"

namespace huddle::models {
namespace {

using ::testing::HasSubstr;

TEST(MlpLayoutTest, NamesAndShapesInOrder) {
  const ModelLayout layout = Layout(MlpSpec{784, {128, 64}, 10});
  ASSERT_EQ(layout.size(), 6u);
  const std::vector<std::pair<std::string, std::vector<int64_t>>> want = {
      {"fc0.weight", {128, 784}}, {"fc0.bias", {128}},      {"fc1.weight", {64, 128}},
      {"fc1.bias", {64}},         {"fc2.weight", {10, 64}}, {"fc2.bias", {10}}};
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(layout[i].name, want[i].first);
    EXPECT_EQ(layout[i].shape, want[i].second);
    EXPECT_EQ(layout[i].dtype, DType::kFloat32);
  }
  EXPECT_EQ(TotalElements(layout), 784 * 128 + 128 + 128 * 64 + 64 + 64 * 10 + 10);
}

TEST(MlpLayoutTest, NoHiddenLayersIsLogisticRegression) {
  const ModelLayout layout = Layout(MlpSpec{5, {}, 3});
  ASSERT_EQ(layout.size(), 2u);
  EXPECT_EQ(layout[0].shape, (std::vector<int64_t>{3, 5}));
}

TEST(ValidateMlpSpecTest, AcceptsDefaultsAndRejectsBadWidths) {
  EXPECT_TRUE(ValidateModelSpec(MlpSpec{}).ok());
  EXPECT_THAT(ValidateModelSpec(MlpSpec{0, {128}, 10}).message(),
              HasSubstr("model input: dimension 0 is 0"));
  EXPECT_THAT(ValidateModelSpec(MlpSpec{784, {128, -1}, 10}).message(),
              HasSubstr("model layer 2 (dense): out is -1"));
  EXPECT_THAT(ValidateModelSpec(MlpSpec{784, {128}, 1}).message(),
              HasSubstr("the model's output is [1]"));
  EXPECT_THAT(ValidateModelSpec(MlpSpec{int64_t{1} << 25, {}, 10}).message(),
              HasSubstr("model input: dimension 0 is 33554432"));
  EXPECT_THAT(ValidateModelSpec(MlpSpec{1 << 20, {1 << 20}, 10}).message(),
              HasSubstr("parameters and"));
  EXPECT_TRUE(InitModel(MlpSpec{0, {}, 10}, 1).empty());
}

TEST(InitMlpTest, DeterministicBySeed) {
  const MlpSpec spec{20, {16, 8}, 4};
  const TensorList a = InitModel(spec, 7);
  const TensorList b = InitModel(spec, 7);
  const TensorList c = InitModel(spec, 8);
  ASSERT_EQ(a.size(), 6u);
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].data, b[i].data) << a[i].name();
    if (i % 2 == 0) {
      EXPECT_NE(a[i].data, c[i].data) << a[i].name();
    }
  }
  EXPECT_TRUE(CheckParams(spec, a).ok());
  EXPECT_EQ(LayoutOf(a), Layout(spec));
}

TEST(InitMlpTest, KaimingBoundsAndZeroBiases) {
  const MlpSpec spec{400, {100}, 10};
  const TensorList params = InitModel(spec, 3);
  const double hidden_bound = std::sqrt(6.0 / 400), output_bound = std::sqrt(3.0 / 100);
  double sum_sq = 0;
  for (float w : params[0].data) {
    EXPECT_LE(std::abs(w), hidden_bound);
    sum_sq += double{w} * w;
  }
  // Uniform[-b, b] has variance b^2 / 3 = 2 / fan_in.
  EXPECT_NEAR(sum_sq / params[0].data.size(), 2.0 / 400, 0.1 * 2.0 / 400);
  for (float w : params[2].data) EXPECT_LE(std::abs(w), output_bound);
  for (float b : params[1].data) EXPECT_EQ(b, 0.0f);
  for (float b : params[3].data) EXPECT_EQ(b, 0.0f);
}

TEST(CheckParamsTest, NamesTheMismatch) {
  const MlpSpec spec{6, {4}, 3};
  TensorList params = InitModel(spec, 1);
  ASSERT_TRUE(CheckParams(spec, params).ok());

  TensorList missing = params;
  missing.pop_back();
  EXPECT_THAT(CheckParams(spec, missing).message(), HasSubstr("4 parameter tensors, got 3"));

  TensorList wrong_shape = params;
  wrong_shape[2] = Tensor("fc1.weight", {3, 5});
  EXPECT_THAT(CheckParams(spec, wrong_shape).message(),
              HasSubstr("'fc1.weight' with shape [3,5], the model expects 'fc1.weight' with shape "
                        "[3,4]"));

  TensorList wrong_name = params;
  wrong_name[1].spec.name = "fc0.b";
  EXPECT_THAT(CheckParams(spec, wrong_name).message(), HasSubstr("'fc0.b'"));

  TensorList short_data = params;
  short_data[0].data.pop_back();
  EXPECT_THAT(CheckParams(spec, short_data).message(), HasSubstr("23 values for shape [4,6]"));
}

}  // namespace
}  // namespace huddle::models
