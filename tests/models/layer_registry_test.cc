// The registry of layer kinds (models/layers/registry.h): every LayerKind has exactly one
// LayerType, at its enumerator, with a name that round-trips through the config/wire names, and
// the table's parts agree with one another.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "models/layers/registry.h"
#include "models/model.h"

namespace huddle::models {
namespace {

using ::testing::HasSubstr;

constexpr auto kLastKind = LayerKind::kScattering2d;
constexpr size_t kNumKinds = static_cast<size_t>(kLastKind) + 1;

TEST(LayerRegistryTest, ListsEveryKindExactlyOnceInEnumOrder) {
  const auto types = layers::AllLayerTypes();
  ASSERT_EQ(types.size(), kNumKinds);
  std::set<LayerKind> kinds;
  for (size_t i = 0; i < types.size(); ++i) {
    const auto kind = static_cast<LayerKind>(i);
    EXPECT_EQ(types[i]->kind, kind) << "entry " << i << " (" << types[i]->name << ")";
    EXPECT_EQ(&layers::TypeOf(kind), types[i]) << types[i]->name;
    kinds.insert(types[i]->kind);
  }
  EXPECT_EQ(kinds.size(), kNumKinds);
}

TEST(LayerRegistryTest, NamesAreUniqueAndRoundTrip) {
  std::set<std::string> names;
  for (size_t i = 0; i < kNumKinds; ++i) {
    const auto kind = static_cast<LayerKind>(i);
    const std::string name = LayerKindName(kind);
    EXPECT_TRUE(names.insert(name).second) << name << " twice";
    StatusOr<LayerKind> parsed = ParseLayerKind(name);
    ASSERT_TRUE(parsed.ok()) << name << ": " << parsed.status();
    EXPECT_EQ(*parsed, kind) << name;
  }
  EXPECT_THAT(std::string(ParseLayerKind("convolution").status().message()),
              HasSubstr("unknown layer kind 'convolution'; the kinds are dense, conv2d"));
}

TEST(LayerRegistryTest, AValueOutsideTheEnumIsRefusedByName) {
  const auto bogus = static_cast<LayerKind>(kNumKinds + 7);
  EXPECT_EQ(LayerKindName(bogus), "unknown");
  EXPECT_FALSE(HasParameters(bogus));
  ModelSpec spec;
  spec.input = {4};
  spec.layers = {{.kind = bogus}, {.kind = LayerKind::kDense, .out = 2}};
  const Status st = ValidateModelSpec(spec);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(st.message()), HasSubstr("model layer 0 (unknown): unknown kind"));
}

// What NetWorkspace and model.cc rely on: a kind with parameters has a weight and a bias, their
// names, shapes and initialisation, and passes both ways; a per-example norm only where there are
// parameters; every kind but the leading scattering transform runs forward and backward.
TEST(LayerRegistryTest, EachTypeHasTheRulesItsPropertiesNeed) {
  for (const layers::LayerType* type : layers::AllLayerTypes()) {
    SCOPED_TRACE(type->name);
    EXPECT_NE(type->output_shape, nullptr);
    const bool has_params = type->num_trainable > 0;
    EXPECT_TRUE(type->num_trainable == 0 || type->num_trainable == 2);
    EXPECT_EQ(HasParameters(type->kind), has_params);
    EXPECT_EQ(has_params, std::string(type->param_prefix).size() > 0);
    EXPECT_EQ(has_params, type->tensors != nullptr);
    EXPECT_EQ(has_params, type->init != nullptr);
    EXPECT_TRUE(type->add_squared_norms == nullptr || has_params);
    const bool leading_transform = type->kind == LayerKind::kScattering2d;
    EXPECT_EQ(type->forward != nullptr, !leading_transform);
    EXPECT_EQ(type->backward != nullptr, !leading_transform);
  }
}

// Layout's tensors per layer are the table's: a conv, a batch norm (state at the end) and a dense.
TEST(LayerRegistryTest, LayoutFollowsEachKindsTensors) {
  ModelSpec spec;
  spec.input = {1, 6, 6};
  spec.layers = {{.kind = LayerKind::kConv2d, .out = 2, .kernel = 3},
                 {.kind = LayerKind::kBatchNorm},
                 {.kind = LayerKind::kFlatten},
                 {.kind = LayerKind::kDense, .out = 3}};
  ASSERT_TRUE(ValidateModelSpec(spec).ok());
  std::vector<std::string> names;
  for (const TensorSpec& t : Layout(spec)) names.push_back(t.name + ShapeString(t.shape));
  EXPECT_THAT(names,
              ::testing::ElementsAre("conv0.weight[2,1,3,3]", "conv0.bias[2]", "bn0.weight[2]",
                                     "bn0.bias[2]", "fc0.weight[3,32]", "fc0.bias[3]",
                                     "bn0.running_mean[2]", "bn0.running_var[2]"));
  EXPECT_EQ(NumTrainable(spec), 6u);
}

// The config options (a job's YAML) each kind declares: one field each, unique keys, sane ranges.
TEST(LayerRegistryTest, OptionsNameOneFieldEachWithARange) {
  for (const layers::LayerType* type : layers::AllLayerTypes()) {
    SCOPED_TRACE(type->name);
    std::set<std::string> keys;
    for (const LayerOption& o : LayerOptions(type->kind)) {
      EXPECT_TRUE(keys.insert(o.key).second) << o.key << " twice";
      EXPECT_NE(o.integer == nullptr, o.real == nullptr) << o.key;
      EXPECT_LE(o.min, o.max) << o.key;
      EXPECT_TRUE(!o.required || o.absent == 0) << o.key;
    }
  }
  EXPECT_TRUE(LayerOptions(LayerKind::kRelu).empty());
  EXPECT_TRUE(LayerOptions(LayerKind::kBatchNorm).empty());
}

// The options of the YAML's layer entries, kind by kind, as cli/job_config.cc has always read them.
TEST(LayerRegistryTest, OptionsAreTheConfigsKeysAndRanges) {
  auto describe = [](LayerKind kind) {
    std::vector<std::string> out;
    for (const LayerOption& o : LayerOptions(kind)) {
      // Integers as integers ("16777216", not "1.67772e+07").
      auto shown = [&](double v) {
        return o.integer != nullptr ? absl::StrCat(static_cast<int64_t>(v)) : absl::StrCat(v);
      };
      out.push_back(absl::StrCat(o.key, o.required ? "!" : "", " [", shown(o.min), ", ",
                                 shown(o.max), "]",
                                 o.absent != 0 ? absl::StrCat(" = ", shown(o.absent)) : ""));
    }
    return out;
  };
  using ::testing::ElementsAre;
  EXPECT_THAT(describe(LayerKind::kDense), ElementsAre("out! [1, 16777216]"));
  EXPECT_THAT(describe(LayerKind::kConv2d), ElementsAre("out! [1, 16777216]", "kernel! [1, 64]",
                                                        "stride [1, 64]", "padding [0, 63]"));
  for (LayerKind pool : {LayerKind::kMaxPool2d, LayerKind::kAvgPool2d}) {
    EXPECT_THAT(describe(pool),
                ElementsAre("kernel! [1, 64]", "stride [1, 64]", "padding [0, 32]"));
  }
  EXPECT_THAT(describe(LayerKind::kGroupNorm), ElementsAre("groups! [1, 16777216]"));
  EXPECT_THAT(describe(LayerKind::kDropout), ElementsAre("rate! [0, 0.99]"));
  EXPECT_THAT(describe(LayerKind::kScattering2d),
              ElementsAre("scales [1, 4] = 2", "angles [1, 16] = 8"));
  EXPECT_EQ(LayerOptions(LayerKind::kDropout)[0].real, &LayerSpec::rate);
  EXPECT_EQ(LayerOptions(LayerKind::kConv2d)[2].integer, &LayerSpec::stride);
}

}  // namespace
}  // namespace huddle::models
