// How many model-sized host buffers one built-in round allocates on the client: the agent's fit
// path from the FitInstruction to the FitResult it uploads, on the CPU.
//
// Counted: allocations of at least the bytes of the model's largest tensor (98.6% of the model),
// so that every copy of the model counts once, whether packed in one buffer or held as tensors.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>

#include "client/agent.h"
#include "common/rng.h"
#include "models/trainer.h"
#include "models/update.h"
#include "models/wire_spec.h"
#include "tests/client/large_alloc_counter.h"

namespace huddle::client {
namespace {

class UpdateAllocationsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // 64 examples of 784 features (Fashion-MNIST's), 10 classes; an MLP 784-64-10 whose first
    // weight matrix holds 98.6% of the model.
    Rng rng(3);
    data_.feature_dim = 784;
    data_.num_classes = 10;
    for (int i = 0; i < 64; ++i) {
      for (int f = 0; f < 784; ++f) data_.features.push_back(static_cast<float>(rng.Uniform()));
      data_.labels.push_back(i % 10);
    }
    view_.base = &data_;
    spec_.input_dim = 784;
    spec_.hidden = {64};
    spec_.num_classes = 10;
  }

  wire::Message Fit(uint64_t round, const TensorList& global, double clip_norm) {
    wire::FitInstruction fit;
    fit.model_version = round - 1;
    fit.train.batch_size = 16;
    fit.train.learning_rate = 0.1;
    fit.seed = 99;
    fit.nonce = std::string(wire::kNonceBytes, 'n');
    fit.privacy.mode = wire::UpdatePrivacy::Mode::kCentral;
    fit.privacy.clip_norm = clip_norm;
    wire::Message m = wire::MakeMessage(fit, round);
    for (const Tensor& t : global) m.tensors.push_back(wire::TensorPayload::CopyOf(t));
    return m;
  }

  data::Dataset data_;
  data::DatasetView view_;
  models::MlpSpec spec_;
};

TEST_F(UpdateAllocationsTest, OneBuiltInRoundOnTheCpu) {
  ClientAgent agent("edge-1", &view_, /*routine_logs_at_info=*/false);
  ASSERT_TRUE(
      agent.Handle(wire::MakeMessage(wire::Welcome{"job", models::ModelSpecToWire(spec_), 500}))
          .ok());
  const TensorList global = models::InitModel(spec_, 5);
  size_t largest = 0;
  for (const Tensor& t : global) largest = std::max(largest, t.data.size() * sizeof(float));
  // Round 1 warms up what the agent keeps between rounds; round 2 is measured. A small clip
  // norm makes the round clip.
  testing_util::LargeAllocations counted;
  for (uint64_t round = 1; round <= 2; ++round) {
    const wire::Message fit = Fit(round, global, 0.01);
    const wire::Message grant = wire::MakeMessage(wire::UploadGrant{}, round);
    testing_util::CountAllocationsOfAtLeast(largest);
    auto replies = agent.Handle(fit);
    auto upload = agent.Handle(grant);
    counted = testing_util::StopCountingAllocations();
    ASSERT_TRUE(replies.ok()) << replies.status();
    ASSERT_TRUE(upload.ok()) << upload.status();
    ASSERT_EQ(upload->size(), 1u);
    ASSERT_EQ((*upload)[0].type(), wire::MessageType::kFitResult);
  }
  std::printf("model-sized host buffers in one built-in round: %lld (%.2f model sizes)\n",
              static_cast<long long>(counted.count),
              static_cast<double>(counted.bytes) /
                  static_cast<double>(TotalElements(LayoutOf(global)) * sizeof(float)));
  // 19 before the update path was made one (issue 33). Now 7: the global model from the wire,
  // the Trainer's workspace (parameters, gradients, staging copy, momentum), the device's copy of
  // the global model and the delta that is sent.
  EXPECT_LE(counted.count, 7);
}

// A user's trainer: one SGD-like nudge of every value, returned as the model or as its delta.
class NudgeTrainer final : public Trainer {
 public:
  explicit NudgeTrainer(bool as_delta) : as_delta_(as_delta) {}
  int64_t num_examples() const override { return 10; }
  FitResult Fit(const NamedTensors& global, const FitConfig&) override {
    FitResult result;
    result.is_delta = as_delta_;
    result.num_examples = 10;
    result.metrics = {{"loss", 1.5}};
    result.tensors = global;
    for (NamedTensor& t : result.tensors) {
      for (size_t i = 0; i < t.values.size(); ++i) {
        const float step = 0.37f * static_cast<float>((i * 7919) % 13) - 2.0f;
        t.values[i] = as_delta_ ? step : t.values[i] + step;
      }
    }
    return result;
  }

 private:
  bool as_delta_;
};

// FNV-1a over the bytes of every uploaded tensor.
uint64_t HashOf(const wire::Message& result) {
  uint64_t h = 1469598103934665603ull;
  for (const wire::TensorPayload& t : result.tensors) {
    for (float v : t.floats()) {
      uint32_t bits;
      std::memcpy(&bits, &v, sizeof bits);
      for (int b = 0; b < 4; ++b) h = (h ^ ((bits >> (8 * b)) & 0xff)) * 1099511628211ull;
    }
  }
  return h;
}

// The bits of the uploaded update in each kind of round, printed (compared by hand before and
// after a change to the update path; the values depend on the platform's float arithmetic).
TEST_F(UpdateAllocationsTest, UploadedBitsPerKindOfRound) {
  using Mode = wire::UpdatePrivacy::Mode;
  struct Case {
    const char* name;
    int trainer;  // 0: built-in, 1: user's model, 2: user's delta
    Mode mode;
    double clip;
    bool dp_sgd;
  };
  for (const Case& c : {Case{"builtin none", 0, Mode::kNone, 0, false},
                        Case{"builtin central clipped", 0, Mode::kCentral, 0.01, false},
                        Case{"builtin central unclipped", 0, Mode::kCentral, 1e6, false},
                        Case{"builtin local", 0, Mode::kLocal, 0.05, false},
                        Case{"builtin dp-sgd central", 0, Mode::kCentral, 0.02, true},
                        Case{"model central clipped", 1, Mode::kCentral, 3.0, false},
                        Case{"delta central clipped", 2, Mode::kCentral, 3.0, false},
                        Case{"delta none", 2, Mode::kNone, 0, false}}) {
    NudgeTrainer user(c.trainer == 2);
    std::unique_ptr<ClientAgent> agent =
        c.trainer == 0 ? std::make_unique<ClientAgent>("edge-1", &view_, false)
                       : std::make_unique<ClientAgent>("edge-1", &user, false);
    agent->set_noise_source(privacy::NoiseSource::SeededForTesting(17));
    ASSERT_TRUE(
        agent->Handle(wire::MakeMessage(wire::Welcome{"job", models::ModelSpecToWire(spec_), 500}))
            .ok());
    wire::Message fit = Fit(1, models::InitModel(spec_, 5), c.clip);
    auto& instruction = std::get<wire::FitInstruction>(fit.body);
    instruction.privacy.mode = c.mode;
    if (c.mode == Mode::kLocal) instruction.privacy.noise_multiplier = 1.0;
    if (c.dp_sgd) instruction.train.dp_sgd = wire::DpSgdConfig{1.1, 0.5, 16, 1e-5};
    auto replies = agent->Handle(fit);
    ASSERT_TRUE(replies.ok()) << replies.status();
    ASSERT_EQ(replies->size(), 1u) << c.name;
    ASSERT_EQ((*replies)[0].type(), wire::MessageType::kUploadRequest)
        << c.name << ": " << wire::MessageTypeName((*replies)[0].type());
    auto upload = agent->Handle(wire::MakeMessage(wire::UploadGrant{}, 1));
    ASSERT_TRUE(upload.ok()) << upload.status();
    ASSERT_EQ(upload->size(), 1u);
    const auto& result = std::get<wire::FitResult>((*upload)[0].body);
    std::printf("%-28s %016llx within_clip %d examples %llu loss %.9g\n", c.name,
                static_cast<unsigned long long>(HashOf((*upload)[0])), result.within_clip ? 1 : 0,
                static_cast<unsigned long long>(result.num_examples), result.train_loss);
  }
}

// Where they are: models::TrainUpdate alone (the built-in trainer's call), and its Trainer's
// workspace (models/trainer.h: parameters, gradients, the staging copy) within it.
TEST_F(UpdateAllocationsTest, TrainUpdateAndItsWorkspace) {
  const TensorList global = models::InitModel(spec_, 5);
  size_t largest = 0;
  for (const Tensor& t : global) largest = std::max(largest, t.data.size() * sizeof(float));
  models::UpdateOptions options;
  options.train.batch_size = 16;
  options.train.learning_rate = 0.1;
  options.clip_norm = 0.01;
  testing_util::CountAllocationsOfAtLeast(largest);
  auto update = models::TrainUpdate(spec_, options, view_, global);
  const testing_util::LargeAllocations in_update = testing_util::StopCountingAllocations();
  ASSERT_TRUE(update.ok()) << update.status();
  testing_util::CountAllocationsOfAtLeast(largest);
  {
    auto trainer = models::Trainer::Create(spec_, options.train, view_, {});
    ASSERT_TRUE(trainer.ok()) << trainer.status();
    (*trainer)->UploadParams(global);
  }
  const testing_util::LargeAllocations in_workspace = testing_util::StopCountingAllocations();
  std::printf("model-sized host buffers in TrainUpdate: %lld, of which its Trainer's: %lld\n",
              static_cast<long long>(in_update.count), static_cast<long long>(in_workspace.count));
  // Besides its Trainer's: the device's copy of the global model and the delta.
  EXPECT_LE(in_update.count - in_workspace.count, 2);
}

}  // namespace
}  // namespace huddle::client
