// The client agent's protocol logic, message by message, without any transport.
#include "client/agent.h"

#include <gtest/gtest.h>

#include "common/rng.h"
#include "models/wire_spec.h"

namespace huddle::client {
namespace {

class AgentTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // 64 examples of 6 features, 3 classes, learnable (label = argmax of the first 3 features).
    Rng rng(11);
    data_.feature_dim = 6;
    data_.num_classes = 3;
    for (int i = 0; i < 64; ++i) {
      int best = 0;
      float row[6];
      for (int f = 0; f < 6; ++f) row[f] = static_cast<float>(rng.Uniform());
      for (int c = 1; c < 3; ++c) best = row[c] > row[best] ? c : best;
      data_.features.insert(data_.features.end(), row, row + 6);
      data_.labels.push_back(best);
    }
    view_.base = &data_;
    spec_.input_dim = 6;
    spec_.hidden = {4};
    spec_.num_classes = 3;
  }

  wire::Message Welcome() {
    return wire::MakeMessage(wire::Welcome{"job", models::ModelSpecToWire(spec_), 500});
  }

  wire::Message Fit(uint64_t round, const TensorList& global) {
    wire::FitInstruction fit;
    fit.model_version = round - 1;
    fit.train.batch_size = 8;
    fit.train.learning_rate = 0.1;
    fit.train.momentum = 0.0;
    fit.seed = 99;
    fit.nonce = std::string(wire::kNonceBytes, 'n');
    wire::Message m = wire::MakeMessage(fit, round);
    for (const Tensor& t : global) m.tensors.push_back(wire::TensorPayload::CopyOf(t));
    return m;
  }

  data::Dataset data_;
  data::DatasetView view_;
  models::MlpSpec spec_;
};

TEST_F(AgentTest, JoinsTrainsAsksForASlotAndUploadsTheDelta) {
  ClientAgent agent("edge-1", &view_);
  wire::Message join = agent.MakeJoin();
  ASSERT_EQ(join.type(), wire::MessageType::kJoin);
  EXPECT_EQ(std::get<wire::Join>(join.body).client_id, "edge-1");
  EXPECT_EQ(std::get<wire::Join>(join.body).num_examples, 64u);

  ASSERT_TRUE(agent.Handle(Welcome()).ok());
  const TensorList global = models::InitModel(spec_, 5);
  auto replies = agent.Handle(Fit(3, global));
  ASSERT_TRUE(replies.ok()) << replies.status();
  ASSERT_EQ(replies->size(), 1u);
  EXPECT_EQ((*replies)[0].type(), wire::MessageType::kUploadRequest);
  EXPECT_EQ((*replies)[0].round, 3u);
  EXPECT_TRUE((*replies)[0].tensors.empty()) << "the update waits for a grant";

  auto upload = agent.Handle(wire::MakeMessage(wire::UploadGrant{}, 3));
  ASSERT_TRUE(upload.ok());
  ASSERT_EQ(upload->size(), 1u);
  const wire::Message& result = (*upload)[0];
  ASSERT_EQ(result.type(), wire::MessageType::kFitResult);
  const auto& fit = std::get<wire::FitResult>(result.body);
  EXPECT_EQ(fit.num_examples, 64u);
  EXPECT_EQ(fit.model_version, 2u);
  ASSERT_EQ(result.tensors.size(), global.size());

  // delta = local - global, where local is what TrainModel makes of the same inputs.
  TensorList local = global;
  models::TrainOptions train;
  train.batch_size = 8;
  train.learning_rate = 0.1;
  ASSERT_TRUE(
      models::TrainModel(spec_, train, view_, DeriveSeed(99, StableHash("edge-1")), &local).ok());
  for (size_t t = 0; t < global.size(); ++t) {
    auto delta = result.tensors[t].floats();
    ASSERT_EQ(delta.size(), global[t].data.size());
    for (size_t i = 0; i < delta.size(); ++i) {
      EXPECT_EQ(delta[i], local[t].data[i] - global[t].data[i]) << t << " " << i;
    }
  }
  // A second grant has nothing to upload.
  auto again = agent.Handle(wire::MakeMessage(wire::UploadGrant{}, 3));
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(again->empty());
}

TEST_F(AgentTest, UnknownClientErrorMakesItJoinAgain) {
  ClientAgent agent("edge-1", &view_);
  auto replies =
      agent.Handle(wire::MakeError(wire::ErrorCode::kUnknownClient, "restarted coordinator"));
  ASSERT_TRUE(replies.ok());
  ASSERT_EQ(replies->size(), 1u);
  EXPECT_EQ((*replies)[0].type(), wire::MessageType::kJoin);
}

TEST_F(AgentTest, VersionMismatchIsFatalWithTheCoordinatorsText) {
  ClientAgent agent("edge-1", &view_);
  auto replies = agent.Handle(wire::MakeError(
      wire::ErrorCode::kVersionMismatch, "peer speaks version 2, this build speaks version 1"));
  ASSERT_FALSE(replies.ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(replies.status()));
  EXPECT_NE(replies.status().message().find("version 2"), absl::string_view::npos);
}

TEST_F(AgentTest, AGlobalModelOfTheWrongShapeIsRefused) {
  ClientAgent agent("edge-1", &view_);
  ASSERT_TRUE(agent.Handle(Welcome()).ok());
  models::MlpSpec other = spec_;
  other.hidden = {5};
  auto replies = agent.Handle(Fit(1, models::InitModel(other, 1)));
  ASSERT_FALSE(replies.ok());
  EXPECT_NE(replies.status().message().find("does not match"), absl::string_view::npos)
      << replies.status();
}

TEST_F(AgentTest, AJobForOtherFeaturesIsRefusedAtWelcome) {
  ClientAgent agent("edge-1", &view_);
  models::MlpSpec other = spec_;
  other.input_dim = 784;
  auto replies =
      agent.Handle(wire::MakeMessage(wire::Welcome{"job", models::ModelSpecToWire(other), 500}));
  ASSERT_FALSE(replies.ok());
  EXPECT_NE(replies.status().message().find("784 input features"), absl::string_view::npos)
      << replies.status();
}

TEST_F(AgentTest, FailedTrainingIsReportedSoTheRoundNeedNotWaitAndTheAgentStays) {
  ClientAgent agent("edge-1", &view_);
  ASSERT_TRUE(agent.Handle(Welcome()).ok());
  wire::Message fit = Fit(1, models::InitModel(spec_, 1));
  std::get<wire::FitInstruction>(fit.body).train.batch_size = 0;
  auto replies = agent.Handle(fit);
  ASSERT_TRUE(replies.ok());
  ASSERT_EQ(replies->size(), 1u) << "one Error, not silence until the coordinator's deadline";
  const auto* err = std::get_if<wire::Error>(&(*replies)[0].body);
  ASSERT_NE(err, nullptr);
  EXPECT_EQ(err->code, wire::ErrorCode::kInternal);
  EXPECT_EQ((*replies)[0].round, 1u);
  EXPECT_NE(err->message.find("local training failed"), std::string::npos) << err->message;
  EXPECT_FALSE(agent.done());
}

TEST_F(AgentTest, FitBeforeWelcomeRejoins) {
  ClientAgent agent("edge-1", &view_);
  auto replies = agent.Handle(Fit(1, models::InitModel(spec_, 1)));
  ASSERT_TRUE(replies.ok());
  ASSERT_EQ(replies->size(), 1u);
  EXPECT_EQ((*replies)[0].type(), wire::MessageType::kJoin);
}

TEST_F(AgentTest, ShutdownEndsTheAgent) {
  ClientAgent agent("edge-1", &view_);
  ASSERT_TRUE(agent.Handle(wire::MakeMessage(wire::Shutdown{"done"})).ok());
  EXPECT_TRUE(agent.done());
}

}  // namespace
}  // namespace huddle::client
