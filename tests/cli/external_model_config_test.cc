// The job YAML of issue 20: `model: {file: PATH}` (an external model: the file's tensors are its
// layout, their values the initial model), `model.init` next to a built-in model, and
// `evaluation.mode` (server or federated, with its keys). Errors name the key, the file and what
// is wrong.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "cli/job_config.h"
#include "common/tensor_io.h"
#include "models/model.h"

namespace huddle::cli {
namespace {

using ::testing::HasSubstr;

class ExternalModelConfigTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("huddle_extcfg_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string Path(const std::string& name) const { return (dir_ / name).string(); }
  std::string WriteText(const std::string& name, const std::string& text) const {
    std::ofstream(Path(name), std::ios::binary) << text;
    return Path(name);
  }
  std::string WriteModel(const std::string& name, const TensorList& tensors) const {
    EXPECT_TRUE(WriteModelFile(Path(name), tensors).ok());
    return Path(name);
  }
  StatusOr<JobConfig> Load(const std::string& yaml) const {
    return LoadJobConfig(WriteText("job.yaml", yaml));
  }
  std::string ErrorOf(const std::string& yaml) const {
    StatusOr<JobConfig> job = Load(yaml);
    return job.ok() ? "" : std::string(job.status().message());
  }

  // A small network's state: conv1 and head, values t + i / 8.
  static TensorList Torch() {
    TensorList out;
    out.emplace_back("conv1.weight", std::vector<int64_t>{4, 1, 3, 3});
    out.emplace_back("conv1.bias", std::vector<int64_t>{4});
    out.emplace_back("head.weight", std::vector<int64_t>{10, 4});
    for (size_t t = 0; t < out.size(); ++t) {
      for (size_t i = 0; i < out[t].data.size(); ++i) {
        out[t].data[i] = static_cast<float>(t) + static_cast<float>(i) / 8.0f;
      }
    }
    return out;
  }

  std::filesystem::path dir_;
};

TEST_F(ExternalModelConfigTest, AModelFileMakesTheModelExternal) {
  WriteModel("net.bin", Torch());
  StatusOr<JobConfig> job = Load("model: {file: net.bin}\nevaluation: {mode: federated}\n");
  ASSERT_TRUE(job.ok()) << job.status();
  const coordinator::CoordinatorOptions& o = job->coordinator;
  EXPECT_TRUE(o.model.external());
  EXPECT_EQ(models::Layout(o.model), LayoutOf(Torch()));
  ASSERT_NE(o.initial_model, nullptr);
  EXPECT_EQ(o.initial_model->size(), 3u);
  EXPECT_EQ((*o.initial_model)[2].data, Torch()[2].data);
  EXPECT_EQ(models::DescribeModel(o.model), "external model: 3 tensors, 80 parameters");
  EXPECT_EQ(o.eval_mode, coordinator::CoordinatorOptions::EvalMode::kFederated);
  // `kind: external` may be said too.
  EXPECT_TRUE(Load("model: {kind: external, file: net.bin}\nevaluation: {mode: federated}\n").ok());
}

TEST_F(ExternalModelConfigTest, AnExternalModelWithoutFederatedEvaluationIsNotEvaluated) {
  WriteModel("net.bin", Torch());
  StatusOr<JobConfig> job = Load("model: {file: net.bin}\n");
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->coordinator.eval_every, 0) << "the server has nothing to evaluate it with";
  EXPECT_EQ(job->coordinator.eval_mode, coordinator::CoordinatorOptions::EvalMode::kServer);
}

TEST_F(ExternalModelConfigTest, ServerSideEvaluationOfAnExternalModelIsAnError) {
  WriteModel("net.bin", Torch());
  const std::string data = ErrorOf("model: {file: net.bin}\nevaluation: {data: /tmp/fmnist}\n");
  EXPECT_THAT(data, HasSubstr("evaluation.data: the model is external"));
  EXPECT_THAT(data, HasSubstr("evaluation: {mode: federated}"));
  EXPECT_THAT(ErrorOf("model: {file: net.bin}\nevaluation: {every: 2}\n"),
              HasSubstr("evaluation.every: the model is external"));
}

TEST_F(ExternalModelConfigTest, ModelFileErrorsNameTheFileAndTheProblem) {
  EXPECT_THAT(ErrorOf("model: {file: missing.bin}\n"),
              HasSubstr("model.file: no such file: '" + Path("missing.bin") + "'"));
  WriteText("text.bin", "this is not a model file at all");
  EXPECT_THAT(ErrorOf("model: {file: text.bin}\n"),
              HasSubstr(Path("text.bin") + ": not a Huddle model file (bad magic)"));
  WriteModel("good.bin", Torch());
  std::string bytes;
  {
    std::ifstream in(Path("good.bin"), std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  WriteText("truncated.bin", bytes.substr(0, bytes.size() - 10));
  EXPECT_THAT(ErrorOf("model: {file: truncated.bin}\n"),
              HasSubstr("model.file: " + Path("truncated.bin") + ": truncated"));
  TensorList nan = Torch();
  nan[1].data[2] = std::nanf("");
  WriteModel("nan.bin", nan);
  EXPECT_THAT(ErrorOf("model: {file: nan.bin}\n"),
              HasSubstr(Path("nan.bin") + ": tensor 'conv1.bias' element 2 is nan"));
  TensorList dup = Torch();
  dup[2].spec.name = "conv1.bias";
  WriteModel("dup.bin", dup);
  EXPECT_THAT(ErrorOf("model: {file: dup.bin}\n"),
              HasSubstr("model tensor 2 ('conv1.bias'): another tensor has the same name"));
  WriteModel("empty.bin", {});
  EXPECT_THAT(ErrorOf("model: {file: empty.bin}\n"), HasSubstr("holds no tensors"));
}

TEST_F(ExternalModelConfigTest, AnExternalModelTakesNoLayerKeys) {
  WriteModel("net.bin", Torch());
  EXPECT_THAT(ErrorOf("model: {file: net.bin, hidden: [64]}\n"),
              HasSubstr("model.hidden does not apply to an external model"));
  EXPECT_THAT(ErrorOf("model: {file: net.bin, init: net.bin}\n"),
              HasSubstr("model.init does not apply to an external model"));
  EXPECT_THAT(ErrorOf("model: {kind: mlp, file: net.bin}\n"),
              HasSubstr("an external model is given by its file alone"));
  EXPECT_THAT(ErrorOf("model: {kind: external}\n"),
              HasSubstr("an external model is given by its file alone"));
}

TEST_F(ExternalModelConfigTest, InitGivesABuiltInModelsInitialWeights) {
  const models::MlpSpec mlp{6, {5}, 3};
  TensorList init = models::InitModel(mlp, 42);
  WriteModel("init.bin", init);
  // (No server evaluation: the model's 6 inputs are not the default test set's.)
  StatusOr<JobConfig> job = Load(
      "model: {input_dim: 6, hidden: [5], num_classes: 3, init: init.bin}\n"
      "evaluation: {every: 0}\n");
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_FALSE(job->coordinator.model.external());
  ASSERT_NE(job->coordinator.initial_model, nullptr);
  EXPECT_EQ((*job->coordinator.initial_model)[0].data, init[0].data);
  // Also with a layer list.
  const std::string layers =
      "model:\n  input: [6]\n  init: init.bin\n  layers: [{dense: {out: 5}}, {relu: {}}, "
      "{dense: {out: 3}}]\nevaluation: {every: 0}\n";
  EXPECT_TRUE(Load(layers).ok()) << ErrorOf(layers);
  // Without init the seeded initialisation stays.
  EXPECT_EQ(Load("model: {input_dim: 6, hidden: [5], num_classes: 3}\nevaluation: {every: 0}\n")
                ->coordinator.initial_model,
            nullptr);
}

TEST_F(ExternalModelConfigTest, InitErrorsNameTheFirstMismatchingTensor) {
  const models::MlpSpec mlp{6, {5}, 3};
  TensorList init = models::InitModel(mlp, 42);
  TensorList wrong_shape = init;
  wrong_shape[2] = Tensor("fc1.weight", {3, 4});
  WriteModel("shape.bin", wrong_shape);
  EXPECT_THAT(ErrorOf("model: {input_dim: 6, hidden: [5], num_classes: 3, init: shape.bin}\n"),
              HasSubstr("model.init: " + Path("shape.bin") +
                        ": tensor 2 is 'fc1.weight' with shape [3,4] in the file; the model's is "
                        "'fc1.weight' with shape [3,5]"));
  TensorList renamed = init;
  renamed[0].spec.name = "layer0.weight";
  WriteModel("name.bin", renamed);
  EXPECT_THAT(ErrorOf("model: {input_dim: 6, hidden: [5], num_classes: 3, init: name.bin}\n"),
              HasSubstr("tensor 0 is 'layer0.weight' with shape [5,6] in the file; the model's "
                        "is 'fc0.weight' with shape [5,6]"));
  TensorList short_list = init;
  short_list.pop_back();
  WriteModel("short.bin", short_list);
  EXPECT_THAT(ErrorOf("model: {input_dim: 6, hidden: [5], num_classes: 3, init: short.bin}\n"),
              HasSubstr("the file has 3 tensors, the model 4: its tensor 'fc1.bias' with shape [3] "
                        "is missing"));
  TensorList long_list = init;
  long_list.emplace_back("extra", std::vector<int64_t>{2});
  WriteModel("long.bin", long_list);
  EXPECT_THAT(ErrorOf("model: {input_dim: 6, hidden: [5], num_classes: 3, init: long.bin}\n"),
              HasSubstr("tensor 'extra' with shape [2] is not the model's"));
  EXPECT_THAT(ErrorOf("model: {input_dim: 6, hidden: [5], num_classes: 3, init: nothing.bin}\n"),
              HasSubstr("model.init: no such file"));
}

TEST_F(ExternalModelConfigTest, EvaluationModesAndTheirKeys) {
  StatusOr<JobConfig> job = Load(
      "evaluation: {mode: federated, every: 3, clients: 25, deadline_s: 12.5, "
      "max_weight_ratio: 2}\n");
  ASSERT_TRUE(job.ok()) << job.status();
  const coordinator::CoordinatorOptions& o = job->coordinator;
  EXPECT_EQ(o.eval_mode, coordinator::CoordinatorOptions::EvalMode::kFederated);
  EXPECT_EQ(o.eval_every, 3);
  EXPECT_EQ(o.federated_eval.clients, 25);
  EXPECT_EQ(o.federated_eval.deadline_ms, 12500);
  EXPECT_EQ(o.federated_eval.max_weight_ratio, 2.0);
  // Defaults.
  job = Load("evaluation: {mode: federated}\n");
  ASSERT_TRUE(job.ok());
  EXPECT_EQ(job->coordinator.federated_eval.clients, 10);
  EXPECT_EQ(job->coordinator.federated_eval.deadline_ms, 60000);
  EXPECT_EQ(job->coordinator.eval_every, 1);
  EXPECT_EQ(Load("{}")->coordinator.eval_mode, coordinator::CoordinatorOptions::EvalMode::kServer);

  EXPECT_THAT(ErrorOf("evaluation: {mode: federated, data: /tmp/x}\n"),
              HasSubstr("evaluation.data is for mode: server"));
  EXPECT_THAT(ErrorOf("evaluation: {clients: 4}\n"),
              HasSubstr("evaluation.clients is for mode: federated"));
  EXPECT_THAT(ErrorOf("evaluation: {mode: clients}\n"), HasSubstr("evaluation.mode"));
  EXPECT_THAT(ErrorOf("evaluation: {mode: federated, clients: 0}\n"),
              HasSubstr("evaluation.clients"));
  EXPECT_THAT(ErrorOf("evaluation: {mode: federated, max_weight_ratio: 0.5}\n"),
              HasSubstr("evaluation.max_weight_ratio"));
}

TEST_F(ExternalModelConfigTest, FederatedEvaluationIsRefusedUnderDp) {
  EXPECT_THAT(ErrorOf("evaluation: {mode: federated}\ncohort: {sampling: poisson}\n"
                      "privacy: {mode: central, epsilon: 8}\n"),
              HasSubstr("evaluation.mode federated has the clients report"));
  EXPECT_THAT(ErrorOf("evaluation: {mode: federated}\ntrain: {dp_sgd: {}}\n"),
              HasSubstr("evaluation.mode federated has the clients report"));
}

TEST_F(ExternalModelConfigTest, AnExternalModelKeepsClientLevelAndExampleLevelDpSettings) {
  WriteModel("net.bin", Torch());
  // DP-SGD is then the clients' own trainers' to run and report: the job only states it.
  StatusOr<JobConfig> job = Load("model: {file: net.bin}\ntrain: {dp_sgd: {clip_norm: 0.5}}\n");
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_TRUE(job->coordinator.train.dp_sgd.has_value());
  job = Load(
      "model: {file: net.bin}\ncohort: {sampling: poisson, rate: 0.5}\n"
      "privacy: {mode: central, epsilon: 8, expected_cohort_size: 5, adaptive_clipping: {}}\n");
  ASSERT_TRUE(job.ok()) << job.status();
}

TEST_F(ExternalModelConfigTest, TheDatacenterRefusesModelFiles) {
  WriteModel("net.bin", Torch());
  StatusOr<DatacenterConfig> c =
      LoadDatacenterConfig(WriteText("dc.yaml", "model: {file: net.bin}\n"));
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("model.file is not supported here"));
}

}  // namespace
}  // namespace huddle::cli
