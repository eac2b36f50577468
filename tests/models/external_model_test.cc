// External models (issue 20): a spec that holds only the model's tensors. Validation names the
// tensor, Layout is the tensors, the descriptions and shorthands say what is (not) known, every
// built-in trainer and evaluator refuses it with the same message (nothing reaches a workspace),
// and it crosses the wire (models/wire_spec.h through the codec) intact, while a hostile wire spec
// is refused naming the tensor.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "models/dp_sgd.h"
#include "models/model.h"
#include "models/trainer.h"
#include "models/update.h"
#include "models/wire_spec.h"
#include "privacy/noise.h"
#include "proto/codec.h"
#include "tests/models/test_data.h"

namespace huddle::models {
namespace {

using ::testing::HasSubstr;

constexpr char kRefusal[] =
    "the model is external (only its tensors are known): Huddle's built-in trainers cannot train "
    "or evaluate it; clients bring their own trainer (client SDK)";

// A small CNN as PyTorch names its state_dict: 8 tensors, 225,034 parameters.
ModelLayout TorchCnn() {
  return {{"conv1.weight", DType::kFloat32, {32, 1, 3, 3}},  {"conv1.bias", DType::kFloat32, {32}},
          {"conv2.weight", DType::kFloat32, {64, 32, 3, 3}}, {"conv2.bias", DType::kFloat32, {64}},
          {"fc1.weight", DType::kFloat32, {128, 1600}},      {"fc1.bias", DType::kFloat32, {128}},
          {"fc2.weight", DType::kFloat32, {10, 128}},        {"fc2.bias", DType::kFloat32, {10}}};
}

TensorList ZerosOf(const ModelLayout& layout) {
  TensorList out;
  for (const TensorSpec& s : layout) out.emplace_back(s.name, s.shape);
  return out;
}

TEST(ExternalModelTest, AValidSpecIsItsTensors) {
  const ModelSpec spec = ModelSpec::External(TorchCnn());
  ASSERT_TRUE(ValidateModelSpec(spec).ok()) << ValidateModelSpec(spec);
  EXPECT_TRUE(spec.external());
  EXPECT_FALSE(ModelSpec(MlpSpec{}).external());
  EXPECT_EQ(Layout(spec), TorchCnn());
  EXPECT_EQ(NumTrainable(spec), 8u);
  EXPECT_EQ(DescribeModel(spec), "external model: 8 tensors, 225,034 parameters");
  EXPECT_EQ(AsMlp(spec), std::nullopt);
  EXPECT_EQ(spec.input_dim(), 0);
  EXPECT_EQ(spec.num_classes(), 0);
  EXPECT_FALSE(spec.has_batch_norm());
  EXPECT_TRUE(InitModel(spec, 1).empty()) << "no initialisation rule for an unknown network";
  EXPECT_TRUE(CheckParams(spec, ZerosOf(TorchCnn())).ok());
  EXPECT_THAT(std::string(LayerShapes(spec).status().message()), HasSubstr("is external"));
  EXPECT_TRUE(CheckBuiltIn(ModelSpec(MlpSpec{})).ok());
  EXPECT_EQ(CheckBuiltIn(spec).code(), absl::StatusCode::kFailedPrecondition);
}

TEST(ExternalModelTest, ScalarsAndSingleTensorsAreFine) {
  const ModelSpec spec = ModelSpec::External({{"temperature", DType::kFloat32, {}}});
  EXPECT_TRUE(ValidateModelSpec(spec).ok());
  EXPECT_EQ(DescribeModel(spec), "external model: 1 tensor, 1 parameters");
}

// The error ValidateModelSpec gives for TorchCnn() with `edit` applied.
std::string ErrorWith(const std::function<void(ModelLayout&)>& edit) {
  ModelLayout layout = TorchCnn();
  edit(layout);
  const Status st = ValidateModelSpec(ModelSpec::External(layout));
  EXPECT_FALSE(st.ok());
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  return std::string(st.message());
}

TEST(ExternalModelTest, ValidationNamesTheTensor) {
  EXPECT_THAT(ErrorWith([](ModelLayout& l) {
                l[2].shape = {64, 0, 3, 3};
              }),
              HasSubstr("model tensor 2 ('conv2.weight'): shape [64,0,3,3] has a dimension < 1"));
  EXPECT_THAT(ErrorWith([](ModelLayout& l) { l[1].shape = {-4}; }),
              HasSubstr("model tensor 1 ('conv1.bias'): shape [-4] has a dimension < 1"));
  EXPECT_THAT(ErrorWith([](ModelLayout& l) { l[0].shape = {1, 1, 1, 1, 1, 1, 1, 1, 1}; }),
              HasSubstr("model tensor 0 ('conv1.weight'): rank 9 exceeds the maximum of 8"));
  EXPECT_THAT(ErrorWith([](ModelLayout& l) {
                l[4].shape = {1 << 20, 1 << 20};
              }),
              HasSubstr("model tensor 4 ('fc1.weight'): shape [1048576,1048576] exceeds the "
                        "limit of 268435456 elements"));
  EXPECT_THAT(ErrorWith([](ModelLayout& l) { l[5].name = "fc1.weight"; }),
              HasSubstr("model tensor 5 ('fc1.weight'): another tensor has the same name"));
  EXPECT_THAT(ErrorWith([](ModelLayout& l) { l[3].name.clear(); }),
              HasSubstr("model tensor 3 has an empty name"));
  EXPECT_THAT(ErrorWith([](ModelLayout& l) { l[6].name = "fc2 weight"; }),
              HasSubstr("model tensor 6: its name has the byte 32; names are characters of"));
  EXPECT_THAT(ErrorWith([](ModelLayout& l) { l[6].name = std::string("fc\n2", 4); }),
              HasSubstr("model tensor 6: its name has the byte 10"));
  EXPECT_THAT(ErrorWith([](ModelLayout& l) { l[7].name = std::string(129, 'n'); }),
              HasSubstr("the name is 129 bytes; the maximum is 128"));
  EXPECT_THAT(ErrorWith([](ModelLayout& l) {
                l.clear();
                for (int i = 0; i < 257; ++i)
                  l.push_back({"t" + std::to_string(i), DType::kFloat32, {1}});
              }),
              HasSubstr("the external model has 257 tensors; the maximum is 256"));
  EXPECT_THAT(ErrorWith([](ModelLayout& l) {
                l.clear();
                for (int i = 0; i < 9; ++i) {
                  l.push_back({"t" + std::to_string(i), DType::kFloat32, {1 << 14, 1 << 14}});
                }
              }),
              HasSubstr("model tensor 8 ('t8'): the model reaches 2415919104 parameters; the "
                        "maximum is 2147483648"));
  // Names PyTorch and TensorFlow use are fine.
  const ModelSpec names =
      ModelSpec::External({{"module.layer1.0.conv1.weight", DType::kFloat32, {2}},
                           {"dense/kernel:0", DType::kFloat32, {2, 2}},
                           {"Block-3_bn.running_var", DType::kFloat32, {2}}});
  EXPECT_TRUE(ValidateModelSpec(names).ok()) << ValidateModelSpec(names);
}

TEST(ExternalModelTest, AnExternalSpecHasNoInputOrLayers) {
  ModelSpec spec = ModelSpec::External(TorchCnn());
  spec.input = {784};
  EXPECT_THAT(std::string(ValidateModelSpec(spec).message()),
              HasSubstr("its input and layers must be empty"));
}

class ExternalRefusalTest : public ::testing::Test {
 protected:
  const ModelSpec spec_ = ModelSpec::External(TorchCnn());
  const TensorList params_ = ZerosOf(TorchCnn());
  const data::Dataset data_ = Blobs(40, 4, 2, 1);
  const data::DatasetView view_{&data_, {}};

  static void ExpectRefused(const Status& st, const char* entry) {
    EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << entry << ": " << st;
    EXPECT_EQ(st.message(), kRefusal) << entry;
  }
};

TEST_F(ExternalRefusalTest, EveryBuiltInEntryPointRefusesIt) {
  TensorList params = params_;
  ExpectRefused(TrainModel(spec_, TrainOptions{}, view_, 1, &params).status(), "TrainModel");
  EXPECT_EQ(params[0].data, params_[0].data) << "untouched";
  ExpectRefused(EvaluateModel(spec_, params_, view_).status(), "EvaluateModel");
  ExpectRefused(Evaluator::Create(spec_, view_).status(), "Evaluator::Create");
  ExpectRefused(Trainer::Create(spec_, TrainOptions{}, view_, Trainer::Loop{}).status(),
                "Trainer::Create");
  ExpectRefused(CheckDpSgdModel(spec_), "CheckDpSgdModel");
  privacy::NoiseSource noise = privacy::NoiseSource::SeededForTesting(3);
  ExpectRefused(TrainDpSgd(spec_, TrainOptions{}, DpSgdOptions{}, view_, noise, &params).status(),
                "TrainDpSgd");
  UpdateOptions update;
  ExpectRefused(TrainUpdate(spec_, update, view_, params_).status(), "TrainUpdate");
  update.dp_sgd = DpSgdOptions{};
  update.noise = &noise;
  ExpectRefused(TrainUpdate(spec_, update, view_, params_).status(), "TrainUpdate (DP-SGD)");
  ExpectRefused(PerExampleGradientNorms(spec_, params_, view_).status(), "PerExampleGradientNorms");
}

TEST_F(ExternalRefusalTest, MismatchedParamsStillGetTheRefusalFirst) {
  TensorList wrong;
  wrong.emplace_back("x", std::vector<int64_t>{3});
  ExpectRefused(TrainModel(spec_, TrainOptions{}, view_, 1, &wrong).status(), "TrainModel");
  ExpectRefused(EvaluateModel(spec_, wrong, view_).status(), "EvaluateModel");
}

// ---- The wire ----

// `spec` to the wire, through the codec in a Welcome, and back.
StatusOr<ModelSpec> ThroughTheWire(const wire::ModelSpec& spec) {
  wire::Message welcome = wire::MakeMessage(wire::Welcome{"job", spec, 1000}, 0, "coordinator");
  HUDDLE_ASSIGN_OR_RETURN(wire::Message got, wire::Decode(wire::EncodeToFrames(welcome)));
  return ModelSpecFromWire(std::get<wire::Welcome>(got.body).model);
}

TEST(ExternalWireTest, AnExternalSpecRoundTrips) {
  const ModelSpec spec = ModelSpec::External(TorchCnn());
  const wire::ModelSpec w = ModelSpecToWire(spec);
  EXPECT_EQ(w.kind, "external");
  EXPECT_EQ(w.tensors, TorchCnn());
  EXPECT_TRUE(w.layers.empty() && w.input_shape.empty() && w.hidden.empty());
  StatusOr<ModelSpec> back = ThroughTheWire(w);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, spec);
  // Built-in models keep their kinds.
  EXPECT_EQ(ModelSpecToWire(MlpSpec{6, {5}, 3}).kind, "mlp");
  EXPECT_EQ(*ThroughTheWire(ModelSpecToWire(MlpSpec{6, {5}, 3})), ModelSpec(MlpSpec{6, {5}, 3}));
}

TEST(ExternalWireTest, AnAgentRefusesAnExternalSpecThatDoesNotValidateNamingTheTensor) {
  wire::ModelSpec w = ModelSpecToWire(ModelSpec::External(TorchCnn()));
  w.tensors[4].name = "fc1.bias";  // a duplicate
  StatusOr<ModelSpec> got = ThroughTheWire(w);
  ASSERT_FALSE(got.ok());
  EXPECT_THAT(std::string(got.status().message()),
              HasSubstr("model tensor 5 ('fc1.bias'): another tensor has the same name"));

  w = ModelSpecToWire(ModelSpec::External(TorchCnn()));
  w.tensors[1].name = "conv1.bias;rm -rf";
  got = ThroughTheWire(w);
  ASSERT_FALSE(got.ok());
  EXPECT_THAT(std::string(got.status().message()), HasSubstr("model tensor 1: its name has"));

  w = ModelSpecToWire(ModelSpec::External(TorchCnn()));
  w.tensors[7].name = std::string(200, 'a');  // within the codec's 256, over the model's 128
  got = ThroughTheWire(w);
  ASSERT_FALSE(got.ok());
  EXPECT_THAT(std::string(got.status().message()), HasSubstr("model tensor 7"));
}

TEST(ExternalWireTest, HostileWireSpecsAreRefused) {
  wire::ModelSpec empty;
  empty.kind = "external";
  EXPECT_THAT(std::string(ModelSpecFromWire(empty).status().message()),
              HasSubstr("lists no tensors"));

  wire::ModelSpec mixed = ModelSpecToWire(ModelSpec::External(TorchCnn()));
  mixed.input_shape = {1, 28, 28};
  EXPECT_THAT(std::string(ModelSpecFromWire(mixed).status().message()),
              HasSubstr("an external model is its tensors only"));

  wire::ModelSpec tensors_on_mlp = ModelSpecToWire(MlpSpec{6, {5}, 3});
  tensors_on_mlp.tensors = TorchCnn();
  EXPECT_THAT(std::string(ModelSpecFromWire(tensors_on_mlp).status().message()),
              HasSubstr("only kind 'external' may"));

  // Shapes the codec lets through (it bounds elements by its own limit) but the model does not.
  wire::ModelSpec zero = ModelSpecToWire(ModelSpec::External(TorchCnn()));
  zero.tensors[0].shape = {32, 1, 3, 0};
  StatusOr<ModelSpec> got = ModelSpecFromWire(zero);
  ASSERT_FALSE(got.ok());
  EXPECT_THAT(std::string(got.status().message()),
              HasSubstr("model tensor 0 ('conv1.weight'): shape [32,1,3,0]"));
  // And the codec refuses what it must before anything else sees it.
  EXPECT_FALSE(ThroughTheWire(zero).ok());
}

}  // namespace
}  // namespace huddle::models
