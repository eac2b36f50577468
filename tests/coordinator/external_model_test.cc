// The coordinator with an external model (only its tensors are known): it starts from the given
// initial model, fake clients' deltas update it by name and shape, a wrong-shaped update is refused
// naming the tensor, checkpoints resume it exactly, model.bin holds it, and client-level DP
// (central noise, local noise, adaptive clipping) runs unchanged since it only sees tensors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "common/file_util.h"
#include "common/tensor_io.h"
#include "coordinator/checkpoint.h"
#include "coordinator/coordinator.h"
#include "tests/coordinator/fake_federation.h"
#include "tests/coordinator/run_job.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/tensors.h"

namespace huddle::coordinator {
namespace {

using testing::Behaviour;
using testing::ManualClock;
using testing::SyntheticClient;

// A network no layer list describes: PyTorch-style names, a scalar, a 4-D weight first.
ModelLayout ExternalLayout() {
  return {{"conv1.weight", DType::kFloat32, {4, 1, 3, 3}},
          {"conv1.bias", DType::kFloat32, {4}},
          {"attn.in_proj_weight", DType::kFloat32, {12, 4}},
          {"head/kernel:0", DType::kFloat32, {3, 4}},
          {"logit_scale", DType::kFloat32, {}}};
}

// Recognisable initial values: tensor t element i = t + i / 100.
TensorList InitialValues() {
  TensorList out;
  const ModelLayout layout = ExternalLayout();
  for (size_t t = 0; t < layout.size(); ++t) {
    Tensor& x = out.emplace_back(layout[t].name, layout[t].shape);
    for (size_t i = 0; i < x.data.size(); ++i) {
      x.data[i] = static_cast<float>(t) + static_cast<float>(i) / 100.0f;
    }
  }
  return out;
}

class ExternalCoordinatorTest : public ::testing::Test {
 protected:
  CoordinatorOptions Options(int64_t rounds, int64_t cohort) {
    CoordinatorOptions o;
    o.job_name = "external";
    o.seed = 5;
    o.rounds = rounds;
    o.model = models::ModelSpec::External(ExternalLayout());
    o.initial_model = std::make_shared<const TensorList>(InitialValues());
    o.cohort.size = cohort;
    o.min_clients = cohort;
    o.upload_slots = 2;
    o.client_timeout_ms = 0;
    o.eval_every = 0;
    return o;
  }

  std::vector<SyntheticClient> Clients(int n) {
    std::vector<SyntheticClient> out;
    for (int i = 0; i < n; ++i) {
      out.push_back({"c" + std::to_string(i), Behaviour::kHonest, 40 + 20 * uint64_t(i)});
    }
    return out;
  }

  // Runs a job to its end; the federation stays alive for inspection.
  StatusOr<TensorList> Run(const CoordinatorOptions& o, std::vector<SyntheticClient> clients,
                           std::vector<RoundMetrics>* metrics = nullptr) {
    job_ = testing::RunJob(o, {.clients = std::move(clients), .clock = &clock_});
    if (metrics) metrics->insert(metrics->end(), job_.metrics.begin(), job_.metrics.end());
    HUDDLE_RETURN_IF_ERROR(job_.status);
    summary_ = job_.summary;
    return job_.model;
  }

  // A fresh directory (not yet created: the coordinator makes it), removed after the test.
  std::string TempDir(const std::string& name) { return dirs_.Make("external_" + name, false); }
  testing::TempDirs dirs_;

  ManualClock clock_;    // shared by the test's jobs
  testing::JobRun job_;  // the last job run
  JobSummary summary_;
};

TEST_F(ExternalCoordinatorTest, StartsFromTheGivenModelAndAppliesTheWeightedMeanByName) {
  const CoordinatorOptions o = Options(1, 3);
  std::vector<RoundMetrics> metrics;
  StatusOr<TensorList> model = Run(o, Clients(3), &metrics);
  ASSERT_TRUE(model.ok()) << model.status();
  ASSERT_EQ(metrics.size(), 1u);
  EXPECT_TRUE(metrics[0].updated);
  EXPECT_EQ(metrics[0].results, 3);
  // The instruction carried the initial model, tensor by tensor.
  ASSERT_FALSE(job_.federation->fits().empty());

  const TensorList init = InitialValues();
  const ModelLayout layout = ExternalLayout();
  ASSERT_EQ(LayoutOf(*model), layout) << "names and shapes are the model's, in its order";
  double total = 0;
  for (const SyntheticClient& c : Clients(3)) total += static_cast<double>(c.num_examples);
  for (size_t t = 0; t < layout.size(); ++t) {
    for (size_t i = 0; i < init[t].data.size(); ++i) {
      double sum = 0;
      for (const SyntheticClient& c : Clients(3)) {
        sum +=
            static_cast<double>(c.num_examples) * testing::HonestDelta(layout, 1, c.id)[t].data[i];
      }
      EXPECT_NEAR((*model)[t].data[i], init[t].data[i] + sum / total, 1e-6)
          << layout[t].name << " " << i;
    }
  }
}

TEST_F(ExternalCoordinatorTest, AWrongShapedUpdateIsRefusedNamingTheTensor) {
  std::vector<SyntheticClient> clients = Clients(2);
  clients.push_back({"bad", Behaviour::kWrongShape, 100});
  std::vector<RoundMetrics> metrics;
  StatusOr<TensorList> model = Run(Options(1, 3), clients, &metrics);
  ASSERT_TRUE(model.ok()) << model.status();
  ASSERT_EQ(metrics.size(), 1u);
  EXPECT_EQ(metrics[0].results, 2);
  EXPECT_EQ(metrics[0].rejected, 1);
  EXPECT_EQ(job_.federation->ErrorsSent("bad", wire::ErrorCode::kInvalidUpdate), 1);
  EXPECT_EQ(job_.federation->LastErrorText("bad"),
            "tensor 0 is 'conv1.weight' [5,1] float32; round 1 expects 'conv1.weight' [4,1,3,3] "
            "float32");
}

TEST_F(ExternalCoordinatorTest, WithoutAnInitialModelOrWithAWrongOneTheJobDoesNotStart) {
  CoordinatorOptions o = Options(1, 1);
  o.initial_model.reset();
  StatusOr<TensorList> got = Run(o, Clients(1));
  EXPECT_TRUE(absl::IsInvalidArgument(got.status())) << got.status();
  EXPECT_NE(got.status().message().find("the model is external"), absl::string_view::npos);

  TensorList wrong = InitialValues();
  wrong[2] = Tensor("attn.in_proj_weight", {4, 12});
  o.initial_model = std::make_shared<const TensorList>(wrong);
  got = Run(o, Clients(1));
  EXPECT_TRUE(absl::IsInvalidArgument(got.status())) << got.status();
  EXPECT_NE(got.status().message().find("'attn.in_proj_weight' with shape [4,12]"),
            absl::string_view::npos)
      << got.status();

  TensorList nan = InitialValues();
  nan[4].data[0] = std::nanf("");
  o.initial_model = std::make_shared<const TensorList>(nan);
  got = Run(o, Clients(1));
  EXPECT_TRUE(absl::IsInvalidArgument(got.status())) << got.status();
  EXPECT_NE(got.status().message().find("'logit_scale' element 0 is nan"), absl::string_view::npos)
      << got.status();
}

TEST_F(ExternalCoordinatorTest, AnInitialModelReplacesTheSeededInitOfABuiltInModelToo) {
  CoordinatorOptions o = Options(1, 2);
  o.model = models::MlpSpec{6, {5}, 3};
  TensorList init = models::InitModel(o.model, 99);
  for (Tensor& t : init) std::fill(t.data.begin(), t.data.end(), 0.25f);
  o.initial_model = std::make_shared<const TensorList>(init);
  job_ = testing::RunJob(o, {.clients = Clients(2), .clock = &clock_});
  ASSERT_TRUE(job_.status.ok());
  // The first instruction carried the given values, so the model is 0.25 + the mean delta.
  const TensorList d0 = testing::HonestDelta(models::Layout(o.model), 1, "c0");
  const TensorList d1 = testing::HonestDelta(models::Layout(o.model), 1, "c1");
  EXPECT_NEAR(job_.model[0].data[0], 0.25 + (40 * d0[0].data[0] + 60 * d1[0].data[0]) / 100.0,
              1e-6);
}

TEST_F(ExternalCoordinatorTest, CheckpointsResumeExactlyAndModelBinHoldsTheModel) {
  CoordinatorOptions whole = Options(3, 3);
  whole.out_dir = TempDir("whole");
  StatusOr<TensorList> reference = Run(whole, Clients(3));
  ASSERT_TRUE(reference.ok()) << reference.status();
  StatusOr<TensorList> file = ReadModelFile(whole.out_dir + "/model.bin");
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_TRUE(testing::BitwiseEqual(*file, *reference));

  CoordinatorOptions first = Options(2, 3);
  first.out_dir = TempDir("resumed");
  ASSERT_TRUE(Run(first, Clients(3)).ok());
  StatusOr<Checkpoint> ckpt = ReadCheckpoint(first.out_dir + "/checkpoint.bin");
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_EQ(ckpt->completed_round, 2u);
  EXPECT_EQ(LayoutOf(ckpt->model), ExternalLayout());
  CoordinatorOptions rest = Options(3, 3);
  rest.out_dir = first.out_dir;
  rest.resume = true;
  StatusOr<TensorList> resumed = Run(rest, Clients(3));
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  EXPECT_TRUE(testing::BitwiseEqual(*resumed, *reference))
      << "the checkpoint wins over the initial model";
  std::filesystem::remove_all(whole.out_dir);
  std::filesystem::remove_all(first.out_dir);
}

// Client-level DP only sees tensors: central noise (with adaptive clipping) and local noise run
// unchanged on an external model.
TEST_F(ExternalCoordinatorTest, ClientLevelDpRunsUnchanged) {
  for (privacy::PrivacyMode mode : {privacy::PrivacyMode::kCentral, privacy::PrivacyMode::kLocal}) {
    SCOPED_TRACE(privacy::PrivacyModeName(mode));
    CoordinatorOptions o = Options(3, 4);
    o.cohort.sampling = CohortOptions::Sampling::kPoisson;
    o.cohort.rate = 1.0;
    o.privacy.mode = mode;
    if (mode == privacy::PrivacyMode::kCentral) {
      o.privacy.expected_cohort_size = 4;
      o.privacy.adaptive.enabled = true;
      o.privacy.adaptive.count_stddev = 2.0;
    }
    o.privacy.clip_norm = 1.0;  // the honest deltas' norms are about 0.1
    o.privacy.delta = 1e-5;
    o.privacy.noise_seed = 3;
    privacy::ScheduleRange all;
    all.first_round = 1;
    all.last_round = 3;
    all.noise_multiplier = 1.0;
    o.privacy.schedule = {all};
    o.out_dir = TempDir("dp");
    std::vector<RoundMetrics> metrics;
    StatusOr<TensorList> model = Run(o, Clients(4), &metrics);
    ASSERT_TRUE(model.ok()) << model.status();
    ASSERT_EQ(metrics.size(), 3u);
    for (const RoundMetrics& m : metrics) {
      EXPECT_TRUE(m.updated);
      EXPECT_EQ(m.results, 4);
      ASSERT_TRUE(m.privacy.has_value());
      EXPECT_GT(m.privacy->epsilon, 0);
    }
    if (mode == privacy::PrivacyMode::kCentral) {
      EXPECT_TRUE(metrics[0].privacy->next_clip_norm.has_value()) << "adaptive clipping ran";
    }
    ASSERT_EQ(LayoutOf(*model), ExternalLayout());
    EXPECT_TRUE(CheckFinite(*model, "model").ok());
    EXPECT_FALSE(testing::BitwiseEqual(*model, InitialValues()))
        << "the noised mean moved the model";
    EXPECT_TRUE(std::filesystem::exists(o.out_dir + "/privacy.json"));
    EXPECT_TRUE(summary_.epsilon.has_value());
    std::filesystem::remove_all(o.out_dir);
  }
}

}  // namespace
}  // namespace huddle::coordinator
