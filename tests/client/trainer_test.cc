// The agent with a user's trainer (huddle/client/trainer.h): every result is checked, turned into
// the update (delta, clip, local DP noise, the ledger) by the agent, whatever the trainer did.
#include "huddle/client/trainer.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <functional>
#include <stdexcept>
#include <thread>

#include "client/agent.h"
#include "models/wire_spec.h"
#include "privacy/clip.h"

namespace huddle::client {
namespace {

// A trainer whose Fit is the test's function.
class FakeTrainer : public Trainer {
 public:
  int64_t num_examples() const override { return examples; }
  void Start(const JobInfo& job) override {
    if (!refuse.empty()) throw std::runtime_error(refuse);
    started = job;
  }
  FitResult Fit(const NamedTensors& global, const FitConfig& config) override {
    last_config = config;
    return fit(global, config);
  }

  int64_t examples = 50;
  std::string refuse;
  JobInfo started;
  FitConfig last_config;
  std::function<FitResult(const NamedTensors&, const FitConfig&)> fit;
};

// Adds `step` to every value: the local model.
FitResult AddStep(const NamedTensors& global, float step) {
  FitResult r;
  r.tensors = global;
  for (NamedTensor& t : r.tensors) {
    for (float& v : t.values) v += step;
  }
  r.num_examples = 40;
  r.metrics = {{"loss", 0.5}, {"accuracy", 0.75}};
  return r;
}

class TrainerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    spec_.input_dim = 6;
    spec_.hidden = {4};
    spec_.num_classes = 3;
    global_ = models::InitModel(spec_, 5);
  }

  wire::Message Welcome() {
    return wire::MakeMessage(wire::Welcome{"job", models::ModelSpecToWire(spec_), 500});
  }

  wire::Message Fit(uint64_t round, wire::FitInstruction fit = {}) {
    fit.model_version = round - 1;
    fit.train.epochs = 2;
    fit.train.batch_size = 8;
    fit.seed = 99;
    fit.nonce = std::string(wire::kNonceBytes, 'n');
    wire::Message m = wire::MakeMessage(fit, round);
    for (const Tensor& t : global_) m.tensors.push_back(wire::TensorPayload::CopyOf(t));
    return m;
  }

  // Fit, then the grant: the uploaded FitResult, or the Error the agent answered with.
  wire::Message Round(ClientAgent& agent, uint64_t round, wire::FitInstruction fit = {}) {
    auto replies = agent.Handle(Fit(round, fit));
    EXPECT_TRUE(replies.ok()) << replies.status();
    EXPECT_EQ(replies->size(), 1u);
    if ((*replies)[0].type() != wire::MessageType::kUploadRequest) return (*replies)[0];
    auto upload = agent.Handle(wire::MakeMessage(wire::UploadGrant{}, round));
    EXPECT_TRUE(upload.ok());
    EXPECT_EQ(upload->size(), 1u);
    return (*upload)[0];
  }

  static std::string ErrorOf(const wire::Message& m) {
    const auto* err = std::get_if<wire::Error>(&m.body);
    return err == nullptr ? "" : err->message;
  }

  models::MlpSpec spec_;
  TensorList global_;
  FakeTrainer trainer_;
};

TEST_F(TrainerTest, TheLocalModelBecomesTheDeltaWithTheTrainersCountAndMetrics) {
  trainer_.fit = [](const NamedTensors& g, const FitConfig&) { return AddStep(g, 0.25f); };
  ClientAgent agent("edge-1", &trainer_);
  EXPECT_EQ(std::get<wire::Join>(agent.MakeJoin().body).num_examples, 50u);
  ASSERT_TRUE(agent.Handle(Welcome()).ok());
  EXPECT_EQ(trainer_.started.name, "job");
  EXPECT_EQ(trainer_.started.model_kind, "mlp");
  const ModelLayout layout = models::Layout(spec_);
  ASSERT_EQ(trainer_.started.tensors.size(), layout.size());
  for (size_t i = 0; i < layout.size(); ++i) {
    EXPECT_EQ(trainer_.started.tensors[i].name, layout[i].name);
    EXPECT_EQ(trainer_.started.tensors[i].shape, layout[i].shape);
  }

  const wire::Message result = Round(agent, 3);
  ASSERT_EQ(result.type(), wire::MessageType::kFitResult) << ErrorOf(result);
  const auto& fit = std::get<wire::FitResult>(result.body);
  EXPECT_EQ(fit.num_examples, 40u);
  EXPECT_DOUBLE_EQ(fit.train_loss, 0.5);
  EXPECT_DOUBLE_EQ(fit.train_accuracy, 0.75);
  EXPECT_EQ(trainer_.last_config.round, 3u);
  EXPECT_EQ(trainer_.last_config.epochs, 2);
  EXPECT_EQ(trainer_.last_config.batch_size, 8);
  ASSERT_EQ(result.tensors.size(), global_.size());
  for (size_t t = 0; t < global_.size(); ++t) {
    auto delta = result.tensors[t].floats();
    for (size_t i = 0; i < delta.size(); ++i) {
      EXPECT_EQ(delta[i], (global_[t].data[i] + 0.25f) - global_[t].data[i]);
    }
  }
}

TEST_F(TrainerTest, ADeltaIsSentAsItIsAndClippedWhenTheRoundClips) {
  trainer_.fit = [](const NamedTensors& g, const FitConfig&) {
    FitResult r = AddStep(g, 0);
    for (NamedTensor& t : r.tensors) std::fill(t.values.begin(), t.values.end(), 1.0f);
    r.is_delta = true;
    return r;
  };
  ClientAgent agent("edge-1", &trainer_);
  ASSERT_TRUE(agent.Handle(Welcome()).ok());
  const wire::Message plain = Round(agent, 1);
  ASSERT_EQ(plain.type(), wire::MessageType::kFitResult) << ErrorOf(plain);
  for (const auto& t : plain.tensors) {
    for (float v : t.floats()) EXPECT_EQ(v, 1.0f);
  }
  wire::FitInstruction central;
  central.privacy.mode = wire::UpdatePrivacy::Mode::kCentral;
  central.privacy.clip_norm = 0.5;
  const wire::Message clipped = Round(agent, 2, central);
  ASSERT_EQ(clipped.type(), wire::MessageType::kFitResult) << ErrorOf(clipped);
  EXPECT_FALSE(std::get<wire::FitResult>(clipped.body).within_clip);
  TensorList delta;
  for (const auto& t : clipped.tensors) {
    Tensor& d = delta.emplace_back();
    auto f = t.floats();
    d.data.assign(f.begin(), f.end());
  }
  EXPECT_LE(privacy::L2Norm(delta), 0.5);
  EXPECT_GT(privacy::L2Norm(delta), 0.49);
}

TEST_F(TrainerTest, AResultThatDoesNotMatchTheModelFailsTheRoundNamingTheTensor) {
  struct Case {
    const char* what;
    std::function<void(FitResult&)> spoil;
    const char* expect;
  };
  const Case cases[] = {
      {"a tensor missing", [](FitResult& r) { r.tensors.pop_back(); }, "returned 3 tensors"},
      {"renamed", [](FitResult& r) { r.tensors[1].name = "other"; }, "tensor 1 is 'other'"},
      {"reshaped", [](FitResult& r) { r.tensors[0].shape = {24}; }, "[24]"},
      {"too few values", [](FitResult& r) { r.tensors[2].values.pop_back(); }, "values"},
      {"a NaN", [](FitResult& r) { r.tensors[3].values[1] = std::nanf(""); },
       "non-finite value at element 1"},
      {"no examples", [](FitResult& r) { r.num_examples = 0; }, "0 examples"},
  };
  for (const Case& c : cases) {
    trainer_.fit = [&](const NamedTensors& g, const FitConfig&) {
      FitResult r = AddStep(g, 0.1f);
      c.spoil(r);
      return r;
    };
    ClientAgent agent("edge-1", &trainer_);
    ASSERT_TRUE(agent.Handle(Welcome()).ok());
    const wire::Message reply = Round(agent, 1);
    ASSERT_EQ(reply.type(), wire::MessageType::kError) << c.what;
    EXPECT_NE(ErrorOf(reply).find(c.expect), std::string::npos) << c.what << ": " << ErrorOf(reply);
    EXPECT_FALSE(agent.done());
  }
}

TEST_F(TrainerTest, ATrainerThatThrowsFailsTheRoundOrRefusesTheJob) {
  trainer_.fit = [](const NamedTensors&, const FitConfig&) -> FitResult {
    throw std::runtime_error("CUDA out of memory");
  };
  ClientAgent agent("edge-1", &trainer_);
  ASSERT_TRUE(agent.Handle(Welcome()).ok());
  const wire::Message reply = Round(agent, 1);
  EXPECT_NE(ErrorOf(reply).find("local training failed: CUDA out of memory"), std::string::npos)
      << ErrorOf(reply);
  trainer_.fit = [](const NamedTensors& g, const FitConfig&) { return AddStep(g, 0.1f); };
  EXPECT_EQ(Round(agent, 2).type(), wire::MessageType::kFitResult) << "the agent stays";

  trainer_.refuse = "this trainer's network has 5 tensors";
  ClientAgent refusing("edge-2", &trainer_);
  auto welcome = refusing.Handle(Welcome());
  ASSERT_FALSE(welcome.ok());
  EXPECT_NE(welcome.status().message().find("the trainer refused it: this trainer's network"),
            absl::string_view::npos)
      << welcome.status();
}

TEST_F(TrainerTest, ADpSgdRoundNeedsTheTrainersReportWithinWhatItAllows) {
  wire::FitInstruction dp;
  dp.train.dp_sgd = wire::DpSgdConfig{1.1, 1.0, 10, 1e-5};
  // 50 examples, expected batch 10, 2 epochs: q <= 0.2, steps <= 10, z >= 1.1.
  const auto with = [&](std::optional<DpSgdReport> report) {
    trainer_.fit = [report](const NamedTensors& g, const FitConfig& config) {
      EXPECT_TRUE(config.dp_sgd.has_value());
      FitResult r = AddStep(g, 0.1f);
      r.dp_sgd = report;
      return r;
    };
  };
  ClientAgent agent("edge-1", &trainer_);
  ASSERT_TRUE(agent.Handle(Welcome()).ok());
  with(std::nullopt);
  EXPECT_NE(ErrorOf(Round(agent, 1, dp)).find("reported no DP-SGD run"), std::string::npos);
  with(DpSgdReport{1.0, 0.2, 10});
  EXPECT_NE(ErrorOf(Round(agent, 2, dp)).find("spends more than the round allows"),
            std::string::npos);
  with(DpSgdReport{1.1, 0.3, 10});
  EXPECT_NE(ErrorOf(Round(agent, 3, dp)).find("sampling rate 0.3"), std::string::npos);
  with(DpSgdReport{1.1, 0.2, 11});
  EXPECT_NE(ErrorOf(Round(agent, 4, dp)).find("11 steps"), std::string::npos);
  EXPECT_TRUE(agent.privacy_guard().entries().empty()) << "nothing released, nothing accounted";

  with(DpSgdReport{1.2, 0.1, 8});
  const wire::Message ok = Round(agent, 5, dp);
  ASSERT_EQ(ok.type(), wire::MessageType::kFitResult) << ErrorOf(ok);
  EXPECT_EQ(std::get<wire::FitResult>(ok.body).num_examples, 1u) << "no count under DP-SGD";
  ASSERT_EQ(agent.privacy_guard().entries().size(), 1u);
  const privacy::LedgerEntry& e = agent.privacy_guard().entries()[0];
  EXPECT_EQ(e.mode, "dp_sgd");
  EXPECT_DOUBLE_EQ(e.noise_multiplier, 1.2);
  EXPECT_DOUBLE_EQ(e.sampling_rate, 0.1);
  EXPECT_EQ(e.steps, 8);
}

// `slowdown X` (huddle client/agent --slowdown): after training, the agent waits (X - 1) x the
// training's wall time before it asks to upload, and reports X x that time as a slower device
// would; a slowdown of 1 (or less) waits nothing.
TEST_F(TrainerTest, ASlowdownWaitsOutTheRestOfASlowerDevicesTrainingTime) {
  trainer_.fit = [](const NamedTensors& g, const FitConfig&) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    return AddStep(g, 0.25f);
  };
  std::vector<int64_t> waits;
  ClientAgent agent("edge-1", &trainer_);
  agent.set_slowdown(3, [&waits](int64_t ms) { waits.push_back(ms); });
  ASSERT_TRUE(agent.Handle(Welcome()).ok());
  auto replies = agent.Handle(Fit(1));
  ASSERT_TRUE(replies.ok()) << replies.status();
  ASSERT_EQ(replies->size(), 1u);
  EXPECT_EQ((*replies)[0].type(), wire::MessageType::kUploadRequest);
  ASSERT_EQ(waits.size(), 1u) << "one wait, before the upload request left";
  EXPECT_GE(waits[0], 40) << "twice the 20 ms the training took, at least";
  auto upload = agent.Handle(wire::MakeMessage(wire::UploadGrant{}, 1));
  ASSERT_TRUE(upload.ok());
  ASSERT_EQ(upload->size(), 1u);
  const auto& fit = std::get<wire::FitResult>((*upload)[0].body);
  // train_seconds = 3 t and the wait 2 t (rounded to the millisecond).
  EXPECT_NEAR(fit.train_seconds, 1.5 * static_cast<double>(waits[0]) / 1000, 0.002);
  EXPECT_EQ(waits.size(), 1u) << "the grant waits nothing";

  for (double factor : {1.0, 0.5}) {
    std::vector<int64_t> none;
    ClientAgent plain("edge-2", &trainer_);
    plain.set_slowdown(factor, [&none](int64_t ms) { none.push_back(ms); });
    ASSERT_TRUE(plain.Handle(Welcome()).ok());
    ASSERT_TRUE(plain.Handle(Fit(1)).ok());
    EXPECT_TRUE(none.empty()) << "slowdown " << factor;
  }
}

}  // namespace
}  // namespace huddle::client
